"""``deepgemm_ref.ep.utils``: DeepEP's ``deep_ep.utils`` helpers that scripts import
(``math``: quantisation and small arithmetic; ``envs``: process-group set-up, seeds, printing)."""

from . import envs, math

__all__ = ["envs", "math"]
