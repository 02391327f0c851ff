"""What one published case becomes in the planner: a model, a cluster, the published parallel
configuration, the stack its source documents, its stage split and what the setup had to assume
(fidelity/cases.py case_setup builds it, by the case's group)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.parallel import Parallel
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.stack import Stack


@dataclass(frozen=True)
class CaseSetup:
    """What one published case becomes in the planner: ``unsupported`` says why it is skipped."""

    name: str
    group: str
    sweep: str  # cases whose speeds are ranked against each other
    model: ModelSpec | None
    cluster: Cluster | None
    parallel: Parallel | None
    options: Stack | None
    bounds: tuple[tuple[int, int], ...] | None
    notes: tuple[str, ...]
    unsupported: str = ""
    # unpublished recompute: none, unless none would not fit where the run did (validate_case)
    recompute_guessed: bool = False
    # Megatron's --recompute-method block: the first N blocks of every chunk recompute (with
    # recompute "full"); None: every block (validate_case's guess sets it)
    recompute_layers: int | None = None
    # pipeline runs per optimizer step: a stack whose gradient accumulation loops over whole
    # pipeline schedules (each a fill and drain of ``parallel.num_microbatches``) runs several
    pipeline_passes: int = 1
