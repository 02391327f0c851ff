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

Floor: top (beside planner/cli/); ``planner/__init__.py`` re-exports the first names lazily, so
``import planner`` (and ``plan --help``) does not pay for the search modules or pandas.
"""

from __future__ import annotations

from planner.api.catalog import (components, hardware, hardware_profiles, hardware_sources,
                                 model, model_template, models, sequence_note, stack, stacks)
from planner.api.fidelity import (calibrate, calibrated_hardware, parse_factors,
                                  single_source_settings, validate, validate_runs)
from planner.api.measure import (layout, measure_layers, measure_machine, profile, simulate,
                                 simulation, simulation_summary)
from planner.api.planning import (PARTITION_SOLVERS, check_pipeline, compare_partitions, explain,
                                  partition, solve, sweep)
from planner.api.reporting import report
from planner.api.results import (Explanation, Partition, Profiled, Solution, Stages,
                                 Validation)
from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.sweeping import DEFAULT_MAX_POINTS, SweepResult

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
