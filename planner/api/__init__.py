"""The Python API: what the CLI does, as functions returning typed results with ``.to_frame()``.

    from planner import solve
    result = solve(gpus=16, nodes=2)             # the search of `plan solve`
    result.to_frame()                            # one row per plan (pandas), best first
    result.stages().to_frame()                   # the best plan's stages

``solve``, ``explain``, ``partition``, ``validate`` and ``profile`` take the CLI's options as
keyword arguments (the same names, underscores for dashes) and raise ``PlanInputError`` (a
ValueError) with the CLI's one-line message on bad input, ``NoFeasiblePlan`` when nothing fits.
``model`` is a preset name, a model.json or HF config.json path, or a ModelSpec; ``hardware`` a
hardware JSON path or a Hardware. Every result is a frozen dataclass holding the planner's own
objects (Plan, Profile, ValidationRow, ...), so nothing is lost by the frames.

The CLI's one front door: planner/cli/ calls these (and the catalog, measuring and calibrating
functions beside them) and renders with planner.report. By concept: results.py (the result
types), inputs.py (arguments checked into the planner's objects), planning.py (solve, explain,
partition, sweep), solving.py (`plan solve` in steps: request, search, hint, explain, training,
exports), fidelity.py (validate, calibrate), measure.py (profile, simulate, layout), catalog.py
(models, stacks, components, GPUs), reporting.py (the HTML report). No submodule shares a name
with a function here.

Floor: top (beside planner/cli/). Both this module and ``planner/__init__.py`` (which re-exports
the first names) load their names on first use, so ``import planner`` and ``from planner import
api`` (the CLI's, at ``plan --help``) do not pay for the search modules, numpy or pandas; a name
asked for imports its own submodule only (``api.model`` loads catalog.py, not the search).
"""

from __future__ import annotations

from importlib import import_module

# Where each name lives. Deliberately lazy (PEP 562): ``from planner import api`` loads none of
# these modules, so the CLI (which imports planner.api to declare its commands) starts without
# the search, numpy or pandas; the first use of a name imports its module and binds it here.
_HOMES = {
    "planner.api.catalog": ("components", "hardware", "hardware_profiles", "hardware_sources",
                            "model", "model_template", "models", "sequence_note", "stack",
                            "stacks"),
    "planner.api.fidelity": ("calibrate", "calibrated_hardware", "parse_factors",
                             "single_source_settings", "validate", "validate_runs"),
    "planner.api.measure": ("layout", "measure_layers", "measure_machine", "profile", "simulate",
                            "simulation", "simulation_summary"),
    "planner.api.planning": ("PARTITION_SOLVERS", "check_pipeline", "compare_partitions",
                             "explain", "partition", "solve", "sweep"),
    "planner.api.reporting": ("report",),
    "planner.api.results": ("Explanation", "Partition", "Profiled", "Solution", "Stages",
                            "Validation"),
    "planner.core.errors": ("NoFeasiblePlan", "PlanInputError"),
    "planner.core.limits": ("DEFAULT_MAX_POINTS",),
    "planner.sweeping": ("SweepResult",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["solve", "explain", "partition", "validate", "profile", "Solution", "Stages",
           "Explanation", "Partition", "Validation", "Profiled", "PlanInputError",
           "NoFeasiblePlan", "sweep", "SweepResult", "DEFAULT_MAX_POINTS",
           "compare_partitions", "check_pipeline", "PARTITION_SOLVERS",
           "models", "model", "model_template", "sequence_note", "stacks", "components",
           "hardware_profiles", "hardware_sources", "hardware", "stack",
           "validate_runs", "single_source_settings", "parse_factors", "calibrate",
           "calibrated_hardware",
           "measure_layers", "measure_machine", "simulation", "simulate", "simulation_summary",
           "layout", "report"]


def __getattr__(name: str):
    if name not in _HOME_OF:  # a submodule not yet imported, or no such name
        raise AttributeError(f"module 'planner.api' has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(_HOME_OF[name]), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
