"""Shared test settings: one torch thread (the bundled models are tiny) and hypothesis profiles."""

import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

settings.register_profile(
    "fedsec", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("fedsec")
