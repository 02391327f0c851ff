"""The published runs as the planner sees them: each case of a runs file rebuilt as a model, a
cluster, the PUBLISHED parallel configuration and the software stack its source documents.

Every case of a published-runs file (profiles/validation/published_runs.json; its README describes
the fields) names its bundled stack (``stack``, profiles/stacks/), the named components its source
ran over it (``components``, profiles/components/) and any ``stack_overrides`` (launch flags);
nothing is tuned per case. planner/fidelity/published.py evaluates the cases and compares.

A case's GPUs and links are case_cluster.py's, its stack case_stack.py's; the rest is its group's
(megatron_cases.py: Megatron-LM 2021, BLOOM, the zero-bubble fork; modern_cases.py: llm-foundry,
torchtitan, Llama 3, NeMo; moe_cases.py: the mixture-of-experts runs); here a case's own stage
split is laid over what its group sets up.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.core.limits import MAX_CHUNKS
from planner.core.units import VALIDATION_DIR
from planner.fidelity.case_cluster import case_cluster
from planner.fidelity.case_setup import CaseSetup
from planner.fidelity.case_stack import case_stack
from planner.fidelity.megatron_cases import MEGATRON_GROUPS, megatron_family_setup
from planner.fidelity.modern_cases import MODERN_GROUPS, modern_setup
from planner.fidelity.moe_cases import MOE_GROUPS, moe_setup
from planner.fidelity.runs_schema import check_runs_document
from planner.hardware.profiles import Hardware
from planner.model.spec import ModelSpec
from planner.stack import Stack

# The 2020-23 runs (unfused attention, Megatron-LM / Megatron-DeepSpeed) and the modern stacks
# (flash attention, FSDP / ZeRO-3, Megatron-Core, torchtitan); ``validate_file`` reads both.
DEFAULT_FILE = VALIDATION_DIR / "published_runs.json"
MODERN_FILE = VALIDATION_DIR / "modern_runs.json"
# Mixture-of-experts runs (Megatron-Core and PyTorch-native MoE); their models are HuggingFace
# configs under VALIDATION_DIR / "configs".
MOE_FILE = VALIDATION_DIR / "moe_runs.json"
DEFAULT_FILES = (DEFAULT_FILE, MODERN_FILE, MOE_FILE)


# --- building the cases --------------------------------------------------------------------------


def load_cases(path: str | Path = DEFAULT_FILE) -> list[dict]:
    data = read_json(path, "validation file")
    check_runs_document(data, str(path))  # every case's keys, types, ranges: runs_schema.py
    return data


def stage_bounds(model: ModelSpec, blocks, chunks: int, name: str) -> tuple[tuple[int, int], ...]:
    """The layer bounds of a case's published split ``blocks`` (transformer blocks per model
    chunk, in pipeline order: pp x virtual stages of them): the embedding joins the first chunk
    and the head the last, as Megatron places them. One line naming the run when the list does
    not fit the model."""
    total = sum(1 for layer in model.layers if layer.kind == "block")
    ok = (isinstance(blocks, list) and len(blocks) == chunks
          and all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks)
          and sum(blocks) == total and all(b > 0 for b in blocks[1:-1]))
    if not ok:
        raise PlanInputError(
            f"run '{name}': config.stage_blocks must list {chunks} block counts (one per "
            f"model chunk, none empty but the first and last) summing to the model's "
            f"{total} blocks; got {blocks!r}")
    bounds, start = [], 1
    for b in blocks:
        bounds.append((start, start + b))
        start += b
    bounds[0] = (0, bounds[0][1])
    bounds[-1] = (bounds[-1][0], len(model.layers))
    return tuple(bounds)


def _runs_text(counts: list[int]) -> str:
    """Block counts with repeats folded: [3, 4, 4, 4, 2] -> '3, 4 x 3, 2'."""
    out, k = [], 0
    while k < len(counts):
        j = k
        while j < len(counts) and counts[j] == counts[k]:
            j += 1
        out.append(str(counts[k]) if j - k == 1 else f"{counts[k]} x {j - k}")
        k = j
    return ", ".join(out)


def case_setup(case: dict, hardware: Hardware | None = None,
               stack: Stack | None = None) -> CaseSetup:
    """Model, cluster, published configuration and the case's stack (or ``stack``) for one
    case (on ``hardware`` instead of the bundled profile of its GPU kind, when given); the
    case's own stage split (``config.stage_blocks``) where it gives one."""
    setup = _group_setup(case, hardware, stack)
    par = setup.parallel
    if par is not None and par.num_chunks > MAX_CHUNKS:  # an unpublished v the setup chose
        raise PlanInputError(f"run '{setup.name}': pp {par.pp} x {par.virtual_stages} virtual "
                             f"stages = {par.num_chunks} pipeline chunks; at most {MAX_CHUNKS} "
                             "(core/limits.py)")
    blocks = case["config"].get("stage_blocks")
    if blocks is None or setup.unsupported:
        return setup
    bounds = stage_bounds(setup.model, blocks, setup.parallel.num_chunks, setup.name)
    return replace(setup, bounds=bounds,
                   notes=setup.notes + (f"stage split {_runs_text(blocks)} blocks (the case's)",))


def _group_setup(case: dict, hardware: Hardware | None, stack: Stack | None) -> CaseSetup:
    """:func:`case_setup` by the case's group (megatron_cases.py, modern_cases.py,
    moe_cases.py), before any split the case gives."""
    name, group = case["name"], case.get("group", "")
    cluster, notes = case_cluster(case, hardware)
    opts = case_stack(case, stack)
    notes = list(notes)
    if group.startswith(MEGATRON_GROUPS):
        return megatron_family_setup(case, cluster, notes, opts)
    if group.startswith(MODERN_GROUPS):
        return modern_setup(case, cluster, notes, opts)
    if group.startswith(MOE_GROUPS):
        return moe_setup(case, cluster, notes, opts, VALIDATION_DIR / "configs")
    sweep = group if "sweep" in group else ""  # Table 1 and single runs are not sweeps
    return CaseSetup(name, group, sweep, None, None, None, None, None, tuple(notes),
                     unsupported=f"unknown group {group!r}: no documented stack")
