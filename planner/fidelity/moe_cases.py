"""The mixture-of-experts runs of moe_runs.json as the planner sees them (Megatron-Core, NeMo
Automodel's PyTorch-native MoE, DeepSeek-V3's report): the model from its HuggingFace config, the
published tp, pp, dp, ep, etp and schedule (DualPipe where the source ran it), and the gradient
accumulation over whole pipeline runs a local batch implies.
"""

from __future__ import annotations

from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.core.schedules import DUALPIPE, INTERLEAVED, ONE_F_ONE_B
from planner.fidelity.case_setup import CaseSetup
from planner.fidelity.case_stack import stack_notes
from planner.hardware.profiles import Cluster
from planner.model.load import load_model
from planner.stack import Stack

# the groups of moe_runs.json
MOE_GROUPS = ("moe",)


def moe_setup(case: dict, cluster: Cluster, notes: list[str], opts: Stack,
              configs: Path) -> CaseSetup:
    """An MoE run: the model from its HuggingFace config in ``configs`` (profiles/validation/
    configs/), the published tp, pp, dp, ep, etp, virtual stages and batch; Megatron's even
    block split unless the case gives its own (cases.py case_setup)."""
    name, group, m, cf = case["name"], case["group"], case["model"], case["config"]
    # DeepSeek-V3 report sec. 3.2.1: bidirectional, each F&B pair's all-to-all hidden behind
    # its compute (planner/pipeline/dualpipe.py)
    dual = DUALPIPE.name in str(cf.get("techniques") or "").lower()
    if dual:
        notes.append("DualPipe: two stage copies per rank, all-to-all hidden in F&B pairs")
    if opts.precision == "fp8" and not cluster.hardware.peak_fp8_tflops:
        return CaseSetup(name, group, "", None, None, None, None, None, tuple(notes),
                         unsupported=f"FP8 run on {cluster.hardware.name}, a profile without "
                                     "an FP8 peak")
    notes += stack_notes(cf, opts)
    model = load_model(configs / m["hf_config"]).with_seq_length(
        int(m["seq_len"]))
    tp, pp, dp = int(cf["tp"]), int(cf["pp"]), int(cf["dp"])
    gb, mb = int(cf["global_batch"]), int(cf.get("micro_batch") or 1)
    v = int(cf.get("virtual_stages") or 1)
    text = str(cf.get("recompute") or "none").lower()
    # Megatron's selective recompute of named modules: the case's stack_overrides name them
    # (recompute_modules, cost/recompute.py) as its source's --recompute-modules does
    recompute = "full" if text.startswith("full") else "none" if text == "none" else "selective"
    if cf.get("recompute") is None:
        notes.append("recompute unpublished: none")
    elif recompute == "selective":
        notes.append(f"recompute '{cf['recompute']}': selective, modules "
                     f"{', '.join(opts.recompute_modules)}")
    etp = cf.get("etp")
    # A published local batch (samples per DP rank in one pipeline run) smaller than the step's
    # share: the stack accumulates gradients over several whole pipeline runs (GA of them),
    # each filling and draining the pipeline (local_batch_passes)
    per_run, passes = local_batch_passes(cf, gb, dp, name) if pp > 1 else (gb // dp, 1)
    if passes > 1:
        notes.append(f"GA {passes}: {passes} pipeline runs of {per_run // mb} microbatches a step")
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=max(1, per_run // mb),
                   schedule=(DUALPIPE.name if dual else INTERLEAVED.name if v > 1
                             else ONE_F_ONE_B.name),
                   virtual_stages=v,
                   recompute=recompute, zero=int(cf.get("zero") or 0),
                   sequence_parallel=tp > 1, ep=int(cf.get("ep") or 1),
                   etp=None if etp in (None, tp) else int(etp))
    return CaseSetup(name, group, "", model, cluster, par, opts, None, tuple(notes),
                     recompute_guessed=cf.get("recompute") is None, pipeline_passes=passes)


def local_batch_passes(cf: dict, global_batch: int, dp: int,
                       name: str = "a case") -> tuple[int, int]:
    """(samples per DP rank in one pipeline run, pipeline runs per optimizer step) of a case
    whose config gives ``local_batch``; without it one run holds the rank's whole share.

    NeMo Automodel's benchmark recipe loops its gradient accumulation over local batches, each
    one call of the pipeline schedule: 'ga_steps = global_batch_size // (local_batch_size *
    dp_size)', then 'for ga_step_idx in range(ga_steps):' ... 'batch = next(dataloader_iter)' ...
    'self._forward_backward_step(ga_step_idx, batch, ...)' (nemo_automodel/recipes/llm/
    benchmark.py, run_benchmark), which under PP runs the batch through one schedule,
    'self.pp.info.schedule.step(input_ids, target=targets, losses=losses, **batch)'
    (recipes/llm/train_ft.py); its performance table states LBS and GA per row
    (docs/performance-summary.md: 'LBS: Local Batch Size - size of one step per GPU', 'GA:
    Gradient Accumulation - number of local-batches before optimizer step'). FSDP's gradient
    sync waits for the last of them ('The patch disables sync/resharding for all backwards
    except the last one before optimizer step', nemo_automodel/components/moe/fsdp_mixin.py),
    so only the pipeline repeats. Without a pipeline (pp 1) the runs are just microbatches in
    a row, which one run of them prices alike."""
    share = global_batch // dp
    local = cf.get("local_batch")
    local = share if local is None else int(local)
    if local < 1 or share % local:
        raise PlanInputError(f"{name}: config.local_batch {local} must divide the global "
                             f"batch's share of a DP rank ({global_batch} / dp {dp} = {share})")
    return local, share // local
