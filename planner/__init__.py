"""plan3d: plan tensor x pipeline x data parallel training of large models.

The Python API (planner/api/) is re-exported here lazily::

    from planner import solve, explain, partition, validate, profile, sweep

``import planner`` itself loads nothing but the version: the CLI imports its modules directly, and
``plan --help`` must not pay for the search or for pandas. The first API name asked for loads
planner.api and binds all of them here. No sub-package shares a name with an API function
(the splitting, measuring and sweeping packages are planner.partitioning, planner.profiling and
planner.sweeping), so ``from planner import partition`` is the function whatever was imported
before.
"""

from planner.core.version import __version__

API = ("solve", "explain", "partition", "validate", "profile", "Solution", "Stages",
       "Explanation", "Partition", "Validation", "Profiled", "PlanInputError", "NoFeasiblePlan",
       "sweep", "SweepResult")

__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name not in API:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    from planner import api

    globals().update({n: getattr(api, n) for n in API})
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API))
