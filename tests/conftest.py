"""Shared fixtures: every test starts from the default profile and numerics options."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

import deepgemm_ref as dg

# Deterministic by default (CI reruns give the same examples); HYPOTHESIS_PROFILE=explore
# draws fresh examples.
settings.register_profile(
    "default", derandomize=True, deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("explore", deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The tests that run ``golden --jobs N`` exercise the worker pool itself (its bytes, its
# interruption, its lock), whatever this machine's load and however small their cases: the
# fallback to fewer workers is off for them (inherited by the CLI subprocesses) and on only in
# tests/test_golden_jobs.py, which tests it.
os.environ.setdefault("DEEPGEMM_REF_JOBS_FALLBACK", "0")


@pytest.fixture(autouse=True)
def _reset_global_state():
    """Reset the arch profile, numerics options and DeepGEMM runtime settings around every test."""
    with dg.numerics(arch="sm100"):
        dg.reset_numerics()
        yield
