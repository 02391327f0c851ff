import importlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests judge values, never speed: on a shared 2-core CI machine the time hypothesis takes
# to draw or run an example says nothing about the code (a too-slow health check failed a CI run).
# Derandomized so CI is reproducible: a bug a random draw finds becomes a named regression test
# (test_partition.py's HiGHS tie-break case) rather than a failure one run in many.
settings.register_profile("plan3d", deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("plan3d")

ROOT = Path(__file__).resolve().parent.parent
MOE_CONFIGS = Path(__file__).resolve().parent / "hf_configs" / "moe"


def moe_config(name: str, **changes) -> dict:
    """A bundled HuggingFace MoE config (tests/hf_configs/moe/NAME.json) with ``changes``."""
    return {**json.loads((MOE_CONFIGS / f"{name}.json").read_text()), **changes}


@pytest.fixture(scope="session")
def published_runs():
    return json.loads((ROOT / "profiles" / "validation" / "published_runs.json").read_text())


def engine_module(name: str, reason: str):
    """Import an engine package for a test: skipped without it, but a failure where .ci/run
    installed the engines (PLAN3D_REQUIRE_ENGINE=1), so CI never passes by skipping them."""
    if os.environ.get("PLAN3D_REQUIRE_ENGINE") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=reason)

