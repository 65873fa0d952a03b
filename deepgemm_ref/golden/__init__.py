"""Golden-value bundles: storage, generation, replay and checking."""
