from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Deterministic by default: the same examples on every run and every machine.
# HYPOTHESIS_PROFILE=explore searches afresh (use it when changing the core).
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=150,
)
settings.register_profile(
    "explore",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=2000,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
