"""The search space: every parallel configuration a request allows, each one rejected counted,
in whole configurations, by the rule it breaks (planner/search/rules.py).

A configuration is (tp, pp, dp, micro-batch, M, schedule, virtual stages, recompute, ZeRO, SP).
TP stays inside a node and divides heads, KV heads, FFN and vocabulary; pp·v chunks need at least
as many layers; interleaving needs M divisible by pp (Megatron's rule), while its blocks need not
divide into pp·v chunks (those are bounded before they are screened: `bounded_first`); M follows
from the global batch, micro-batch and dp. Every pin narrows the space.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import product

from planner.core.divisors import divisors
from planner.core.limits import MAX_MICROBATCHES
from planner.cost import context
from planner.cost.recompute import selective_discards_nothing, selective_refusal
from planner.core.parallel import RECOMPUTE_MODES, SCHEDULES, Parallel
from planner.core.schedules import DEFAULT_SCHEDULE, schedule_traits
from planner.search.request import Request, pinned_recompute
from planner.search.rules import (MOE_NEEDS_SP, context_rule, expert_rule, launcher_rule,
                                  schedule_rule, stack_rule, tp_rule)

MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
VIRTUAL_STAGES = (2, 3, 4, 6, 8)


def enumerate_configs(req: Request, rejected: Counter):
    """Yield every Parallel the pins allow; count each rejection by its reason.

    Every count is of whole configurations: a rule that rejects a TP degree or a (tp, pp, mb)
    shape counts every configuration it rules out (``knob_count`` of them), so the configurations
    considered are exactly the rejected ones plus the ones yielded (``space_size``)."""
    model, cluster, pins = req.model, req.cluster, req.pins
    for cp in context_degrees(req):
        cp_reason = context_rule(req.options, model.seq_length, cp)
        if cp_reason:
            rejected[cp_reason] += _context_size(req, cp)
            continue
        gpus = cluster.gpus // cp
        for tp in [pins.tp] if pins.tp else divisors(gpus):
            if gpus % tp:
                continue
            tp_reason = tp_rule(model, cluster, tp) or (
                "heads per TP rank not divisible by cp (all-to-all CP)" if context.heads_problem(
                    model.num_attention_heads, model.num_kv_heads, tp, cp, req.options.cp_comm)
                else None)
            for pp in [pins.pp] if pins.pp else divisors(gpus // tp):
                if (gpus // tp) % pp:
                    continue
                dp = gpus // (tp * pp)
                if pins.dp and dp != pins.dp:
                    continue
                for mb in [pins.micro_batch] if pins.micro_batch else MICRO_BATCHES:
                    m = None if tp_reason else microbatches(req, mb * dp)
                    reason = tp_reason or ("more stages than layers" if pp > len(model.layers)
                                           else "batch not divisible" if m is None else None)
                    if reason:
                        rejected[reason] += knob_count(req, tp, pp, cp)
                        continue
                    if m > MAX_MICROBATCHES:  # core/limits.py: simulator work grows with M
                        rejected[f"more than {MAX_MICROBATCHES:,} microbatches"] += 1
                        continue
                    yield from _knobs(req, Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb,
                                                    num_microbatches=m, cp=cp), rejected)


# Context parallelism is searched from this sequence length up: Megatron-Bridge's long-context
# recipes start there (llama3_8b_16k: SEQ_LENGTH 16384, context_parallelism 2). A space limit
# chosen, not derived: shorter runs use CP too (NeMo's 8K Llama 3 recipes set CP 2), and --cp
# pins it for them; searching it everywhere would multiply every short-sequence search.
CP_SEARCH_MIN_SEQ = 16384
# ... and down to this many tokens per CP rank: a space limit chosen for search time (each
# further halving adds a degree to every search), not a cost; --cp pins beyond it.
CP_MIN_LOCAL_TOKENS = 1024


def bounded_first(req: Request, par: Parallel) -> bool:
    """Whether the search bounds this configuration before it screens it: interleaving whose
    blocks do not split evenly over its pp·v chunks, with v not pinned.  Practitioners run these
    (Llama 3 405B's 126 blocks on PP 16 x v8, Megatron-LM's --pipeline-model-parallel-layout and
    --decoder-first/last-pipeline-num-layers), and the partitioner splits them; but there are
    several per shape (every v of VIRTUAL_STAGES that does not divide), and screening each
    one's even-split prediction nearly tripled the search of llama3-405b on 1,024 GPUs
    (benchmarks/bench_published.py).  The search refines them in the order of their lower bound
    once the screened ones give an incumbent, so those the bound proves slower cost a bound,
    not a screen (planner/search/refinement.py)."""
    return (par.virtual_stages > 1 and req.pins.virtual_stages is None
            and req.model.num_layers % par.num_chunks != 0)


def context_degrees(req: Request) -> tuple[int, ...]:
    """The context-parallel degrees the search tries: the pin, or 1 and (for sequences of at
    least CP_SEARCH_MIN_SEQ tokens) every divisor of the GPU count leaving each rank at least
    CP_MIN_LOCAL_TOKENS tokens."""
    if req.pins.cp:
        return (req.pins.cp,)
    seq = req.model.seq_length
    if seq < CP_SEARCH_MIN_SEQ:
        return (1,)
    return tuple(cp for cp in divisors(req.cluster.gpus)
                 if cp == 1 or seq // cp >= CP_MIN_LOCAL_TOKENS)


def expert_degrees(req: Request, tp: int, cp: int, dp: int) -> tuple[tuple[int, int | None], ...]:
    """The (ep, etp) pairs the search considers for one shape (etp None: same as tp). A dense
    model: (1, None). An MoE model: every ep dividing the stage's tp·cp·dp ranks, with etp = tp
    (Megatron's default) and, where ep > 1 and tp > 1, etp = 1 (experts whole on each GPU, what
    Megatron-Core's MoE guide recommends with EP); expert_rule rejects what cannot run."""
    pins = req.pins
    if not req.model.is_moe:
        return ((1, None),)
    eps = [pins.ep] if pins.ep else divisors(tp * cp * dp)
    out = []
    for ep in eps:
        if pins.etp:
            out.append((ep, None if pins.etp == tp else pins.etp))
            continue
        out.append((ep, None))
        if ep > 1 and tp > 1:
            out.append((ep, 1))
    return tuple(out)


def space_size(req: Request) -> int:
    """How many configurations the pins allow, before any rule: the sum of knob_count over every
    (tp, pp, dp, mb) shape. enumerate_configs accounts for each one exactly once."""
    return sum(_context_size(req, cp) for cp in context_degrees(req))


def _context_size(req: Request, cp: int) -> int:
    """Configurations of one context-parallel degree (a rule on cp rejects all of them)."""
    pins, total = req.pins, 0
    gpus = req.cluster.gpus // cp
    for tp in [pins.tp] if pins.tp else divisors(gpus):
        for pp in [pins.pp] if pins.pp else divisors(gpus // tp):
            if gpus % (tp * pp) or (pins.dp and gpus // (tp * pp) != pins.dp):
                continue
            total += knob_count(req, tp, pp, cp) * (
                1 if pins.micro_batch else len(MICRO_BATCHES))
    return total


def _choices(req: Request, tp: int, pp: int):
    """(schedules, virtual stages of one schedule, recomputes, ZeRO stages, SP) the pins allow."""
    pins = req.pins
    schedules = [pins.schedule] if pins.schedule else (
        [DEFAULT_SCHEDULE] if pp == 1 else [s for s in SCHEDULES if s in req.options.schedules])
    recomputes = [pinned_recompute(pins.recompute)] if pins.recompute else [
        r for r in RECOMPUTE_MODES if not (
            r == "selective" and selective_discards_nothing(req.model, req.options))]
    zeros = [pins.zero] if pins.zero is not None else [0, 1, 2, 3]
    sps = [pins.sequence_parallel] if pins.sequence_parallel is not None else (
        [True, False] if tp > 1 else [False])

    def vs(schedule: str) -> list[int]:
        if not schedule_traits(schedule).takes_virtual_stages:
            return [1]
        return [pins.virtual_stages] if pins.virtual_stages else list(VIRTUAL_STAGES)

    return schedules, vs, recomputes, zeros, sps


def knob_count(req: Request, tp: int, pp: int, cp: int = 1) -> int:
    """Configurations of one (tp, pp, dp, mb) shape: expert split x schedule x virtual stages x
    recompute x ZeRO x SP, as ``_knobs`` enumerates them."""
    schedules, vs, recomputes, zeros, sps = _choices(req, tp, pp)
    dp = max(1, req.cluster.gpus // (cp * tp * pp))
    return len(expert_degrees(req, tp, cp, dp)) * sum(len(vs(s)) for s in schedules) * len(
        recomputes) * len(zeros) * len(sps)


def microbatches(req: Request, per_microbatch_step: int) -> int | None:
    """M for an exact batch, or the most microbatches that keep the batch inside the range
    (more microbatches shrink the pipeline bubble); None when no M fits."""
    if req.batch_range is None:
        batch = req.batch
        return batch // per_microbatch_step if batch % per_microbatch_step == 0 else None
    low, high = req.batch_range
    m = high // per_microbatch_step
    return m if m >= 1 and m * per_microbatch_step >= low else None


def _knobs(req: Request, shape: Parallel, rejected: Counter):
    """The schedule, virtual-stage, recompute, ZeRO and SP choices of one (tp, pp, dp, mb, M)."""
    schedules, vs, recomputes, zeros, sps = _choices(req, shape.tp, shape.pp)
    per_expert_split = sum(len(vs(s)) for s in schedules) * len(recomputes) * len(zeros) * len(
        sps)
    for ep, etp in expert_degrees(req, shape.tp, shape.cp, shape.dp):
        reason = expert_rule(req.model, shape.tp, shape.cp, shape.dp, ep,
                             shape.tp if etp is None else etp)
        if reason:
            rejected[reason] += per_expert_split
            continue
        yield from _schedules(req, replace(shape, ep=ep, etp=etp), rejected)


def _schedules(req: Request, shape: Parallel, rejected: Counter):
    """The schedule, virtual-stage, recompute, ZeRO and SP choices of one shape and expert split."""
    unpriced = selective_refusal(req.model, req.options)  # why selective is not priced, if so
    schedules, vs, recomputes, zeros, sps = _choices(req, shape.tp, shape.pp)
    needs_sp = req.model.is_moe and shape.tp > 1  # MOE_NEEDS_SP (is_moe walks every layer)
    for schedule in schedules:
        for v in vs(schedule):
            timed = replace(shape, schedule=schedule, virtual_stages=v)
            if stack_rule(req.options, timed):
                rejected[f"{req.options.name} runs no {schedule}"] += (
                    len(recomputes) * len(zeros) * len(sps))
                continue
            if schedule_rule(req.model, timed):
                rejected["schedule rule"] += len(recomputes) * len(zeros) * len(sps)
                continue
            for recompute, zero, sp in product(recomputes, zeros, sps):
                if needs_sp and not sp:
                    rejected[MOE_NEEDS_SP] += 1
                    continue
                par = replace(timed, recompute=recompute, zero=zero, sequence_parallel=sp)
                if req.runs_on and launcher_rule(req, par):
                    rejected[f"{req.runs_on} cannot run it"] += 1
                    continue
                if recompute == "selective" and unpriced:  # runs, but is not priced
                    rejected[unpriced] += 1
                    continue
                yield par
