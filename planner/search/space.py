"""The search space: what the user asked for (request and pins), and every parallel
configuration it allows, with the rule each rejected one breaks.

A configuration is (tp, pp, dp, micro-batch, M, schedule, virtual stages, recompute, ZeRO, SP).
TP stays inside a node and divides heads, KV heads, FFN and vocabulary; pp·v chunks need at least
as many layers; interleaving needs M divisible by pp and blocks divisible by pp·v (Megatron's
rules); M follows from the global batch, micro-batch and dp. Every pin narrows the space.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import product

from planner.core.divisors import divisors
from planner.core.limits import MAX_CHUNKS, MAX_MICROBATCHES
from planner.core.errors import PlanInputError
from planner.cost import context
from planner.cost.recompute import selective_discards_nothing, selective_refusal
from planner.launchers import LAUNCHERS, Facts, launcher_allows
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.predict.stages import BLOCK_PIN
from planner.core.parallel import RECOMPUTE_MODES, SCHEDULES, Parallel
from planner.core.schedules import DEFAULT_SCHEDULE, schedule_traits
from planner.predict.stages import METHODS
from planner.stack import Stack, default_stack

DEFAULT_TOKENS_PER_BATCH = 4 * 1024 * 1024  # ~4M tokens: Llama-2/3 and GPT-3 scale batches
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
VIRTUAL_STAGES = (2, 3, 4, 6, 8)


@dataclass(frozen=True)
class Pins:
    """Dimensions the user fixed; None means search it."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: str | None = None
    zero: int | None = None
    sequence_parallel: bool | None = None
    cp: int | None = None  # context parallel (cost/context.py)
    ep: int | None = None  # expert parallel (MoE models only)
    etp: int | None = None  # expert tensor parallel (MoE models only)


@dataclass(frozen=True)
class Request:
    model: ModelSpec
    cluster: Cluster
    global_batch: int | None = None
    batch_range: tuple[int, int] | None = None  # let the search choose the batch in [min, max]
    max_bubble: float | None = None
    pins: Pins = Pins()
    options: Stack = field(default_factory=default_stack)  # the software stack it runs on
    top: int = 10
    refine: int | None = None  # at most K configurations refined; None: until proven (auto)
    launcher: str | None = None  # only configurations this launcher runs (None: the stack's)
    partition_method: str = "auto"  # predict/stages.py METHODS: auto, ilp or dp
    profile: object = None  # a measured Profile (planner/profiling/record.py) replacing analytical times

    @property
    def batch(self) -> int:
        return self.global_batch or default_global_batch(self.model.seq_length)

    @property
    def runs_on(self) -> str | None:
        """The launcher whose rules every plan must pass: the one asked for, else the stack's
        own (a plan priced on megatron-core is one Megatron-LM can launch: no ZeRO-2/3)."""
        if self.launcher is not None:
            return self.launcher
        return self.options.launcher if self.options.launcher in LAUNCHERS else None


def default_global_batch(seq_len: int) -> int:
    return max(1, DEFAULT_TOKENS_PER_BATCH // seq_len)


def parse_refine(value) -> int | None:
    """``--refine``: "auto" (None: refine until plan 1 is proven, within a time budget) or a
    whole number K >= 1 (at most K configurations refined)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise PlanInputError(f"--refine takes auto or a whole number K >= 1, got {value!r}")
    if isinstance(value, float) and k != value:
        raise PlanInputError(f"--refine takes auto or a whole number K >= 1, got {value!r}")
    if k < 1:
        raise PlanInputError(f"--refine must be auto or at least 1, got {k}")
    return k


def validate_pins(req: Request) -> None:
    """Pins that contradict each other or the GPU count: one line, before any search."""
    pins, gpus = req.pins, req.cluster.gpus
    for name in ("tp", "pp", "dp", "micro_batch", "virtual_stages", "cp", "ep", "etp"):
        value = getattr(pins, name)
        if value is not None and value < 1:
            raise PlanInputError(f"--{name.replace('_', '-')} must be positive, got {value}")
    fixed = [v for v in (pins.tp, pins.pp, pins.dp) if v is not None]
    prod = pins.cp or 1
    for v in fixed:
        prod *= v
    if len(fixed) == 3 and prod != gpus:
        cp = f" x --cp {pins.cp}" if pins.cp else ""
        raise PlanInputError(f"--tp {pins.tp}{cp} x --pp {pins.pp} x --dp {pins.dp} = {prod}, "
                             f"but there are {gpus} GPUs; they must multiply to the GPU count")
    if pins.cp and pins.cp > 1:
        problem = context_problem(req.options, req.model.seq_length, pins.cp)
        if problem:
            raise PlanInputError(f"--cp {pins.cp}: {problem}")
        if pins.tp:
            problem = context.heads_problem(req.model.num_attention_heads, req.model.num_kv_heads,
                                            pins.tp, pins.cp, req.options.cp_comm)
            if problem:
                raise PlanInputError(f"--cp {pins.cp}: {problem}; choose another --cp or --tp")
        fixed = fixed or [1]
    if fixed and gpus % prod:
        raise PlanInputError(f"the pinned degrees multiply to {prod}, which does not divide "
                             f"{gpus} GPUs")
    if pins.schedule is not None and pins.schedule not in SCHEDULES:
        raise PlanInputError(f"--schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {pins.schedule!r}")
    if pins.recompute is not None and pins.recompute not in RECOMPUTE_PINS:
        raise PlanInputError(f"--recompute must be one of {', '.join(RECOMPUTE_PINS)}, "
                             f"got {pins.recompute!r}")
    if pins.recompute == "selective":
        unpriced = selective_refusal(req.model, req.options)
        if unpriced:
            raise PlanInputError(f"--recompute selective: {unpriced} ({req.model.name} on the "
                                 f"{req.options.name} stack); use --recompute full or none, or "
                                 "leave --recompute out")
    if pins.zero is not None and pins.zero not in (0, 1, 2, 3):
        raise PlanInputError(f"--zero must be 0, 1, 2 or 3, got {pins.zero}")
    expert_pin_problem(req.model, pins)
    if pins.sequence_parallel and pins.tp == 1:
        raise PlanInputError("--sequence-parallel needs --tp > 1 (it shards what TP replicates)")
    if pins.virtual_stages and pins.virtual_stages > 1 and not (
            pins.schedule and schedule_traits(pins.schedule).takes_virtual_stages):
        raise PlanInputError("--virtual-stages > 1 needs --schedule interleaved (the schedule "
                             "with virtual stages); add it")
    if req.global_batch is not None and req.global_batch < 1:
        raise PlanInputError(f"--global-batch must be positive, got {req.global_batch}")
    if req.batch_range is not None:
        low, high = req.batch_range
        if req.global_batch is not None:
            raise PlanInputError("give --global-batch or --global-batch-range, not both")
        if not 1 <= low <= high:
            raise PlanInputError(f"--global-batch-range needs 1 <= MIN <= MAX, got {low},{high}")
    if req.partition_method not in METHODS:
        raise PlanInputError(f"--partition must be one of {', '.join(METHODS)}, "
                             f"got {req.partition_method!r}")
    if req.top < 1:
        raise PlanInputError(f"--top must be at least 1, got {req.top}")
    if req.refine is not None and req.refine < 1:
        raise PlanInputError(f"--refine must be auto or at least 1, got {req.refine}")
    if req.launcher is not None and req.launcher not in LAUNCHERS:
        raise PlanInputError(f"--launcher must be one of {', '.join(LAUNCHERS)}, "
                             f"got {req.launcher!r}")
    if req.max_bubble is not None and not 0 < req.max_bubble <= 1:
        raise PlanInputError(f"--max-bubble is a fraction in (0, 1], got {req.max_bubble}")


def tp_rule(model: ModelSpec, cluster: Cluster, tp: int) -> str | None:
    """Why tensor parallelism of this degree cannot run here (None when it can). TP groups stay
    inside an NVLink domain: a node on HGX boards, the 72-GPU rack on GB200 NVL72."""
    domain = cluster.nvlink_domain
    if tp > domain or domain % tp:
        return "TP across nodes" if domain == cluster.gpus_per_node else \
            "TP across NVLink domains"
    # No rule for the vocabulary: it is padded to a multiple of TP as Megatron-LM pads it
    # (ModelSpec.padded_vocab_size).
    for what, n in (("heads", model.num_attention_heads), ("KV heads", model.num_kv_heads),
                    ("FFN", model.ffn_hidden_size)):
        if n % tp:
            return f"{what} not divisible by TP"
    return None


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


def context_problem(stack: Stack, seq_len: int, cp: int) -> str | None:
    """Why cp > 1 cannot run on this stack and sequence (None when it can), in full."""
    found = _context_reason(stack, seq_len, cp)
    return found and found[1]


def context_rule(stack: Stack, seq_len: int, cp: int) -> str | None:
    """:func:`context_problem` as the search counts it (one reason per rule)."""
    found = _context_reason(stack, seq_len, cp)
    return found and found[0]


def _context_reason(stack: Stack, seq_len: int, cp: int) -> tuple[str, str] | None:
    """(the counted reason, the full message) of the first context-parallel rule broken."""
    if cp <= 1:
        return None
    if stack.cp_comm is None:
        return (f"{stack.name} runs no context parallelism",
                f"the {stack.name} stack runs no context parallelism (`plan stacks`); use "
                "--stack megatron-core or torchtitan, or drop --cp")
    if not stack.flash_attention:
        return ("context parallelism needs flash attention",
                "context parallelism needs flash attention (Transformer Engine / SDPA ring "
                "attention): drop --no-flash")
    problem = context.sequence_problem(seq_len, cp)
    return problem and ("sequence not divisible by 2*cp", problem)


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


def expert_rule(model: ModelSpec, tp: int, cp: int, dp: int, ep: int, etp: int) -> str | None:
    """Why experts cannot be split this way (None when they can): ep must divide the experts,
    etp·ep the stage's tp·cp·dp ranks (Megatron-Core), etp the expert FFN width."""
    experts = model.num_experts
    if ep > 1 and (not experts or experts % ep):
        return "ep does not divide the experts"
    if (tp * cp * dp) % (ep * etp):
        return "etp x ep does not divide tp x cp x dp"
    widths = {layer.ffn_hidden_size for layer in model.layers if layer.is_moe}
    if any(w % etp for w in widths):
        return "expert FFN not divisible by etp"
    return None


def expert_pin_problem(model: ModelSpec, pins: Pins) -> None:
    """--ep / --etp pins that cannot run: one line, exit 2."""
    if (pins.ep or pins.etp) and not model.is_moe:
        raise PlanInputError(f"--ep and --etp split experts; {model.name} is a dense model (no "
                             "num_experts): drop them")
    if pins.ep and model.num_experts % pins.ep:
        raise PlanInputError(f"--ep {pins.ep} does not divide the {model.num_experts} experts of "
                             f"{model.name}: use a divisor of {model.num_experts}")
    if pins.etp and model.is_moe:
        widths = {layer.ffn_hidden_size for layer in model.layers if layer.is_moe}
        if any(w % pins.etp for w in widths):
            raise PlanInputError(f"--etp {pins.etp} does not divide the expert FFN width "
                                 f"({min(widths)})")


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


# --recompute: a mode every stage uses, or "block" (Megatron's --recompute-method block): each
# stage recomputes its first N blocks, N chosen per stage (predict/stages.py BLOCK_PIN)
RECOMPUTE_PINS = (*RECOMPUTE_MODES, BLOCK_PIN)


def pinned_recompute(pin: str | None) -> str | None:
    """The configuration's recompute mode for a --recompute pin ("block" runs full granularity)."""
    return "full" if pin == BLOCK_PIN else pin


def exact_recompute(req: Request) -> bool | str:
    """How the stages' modes are narrowed (predict/stages.py allowed_modes): to Megatron's block
    method on that pin; else to the configuration's own mode where it is pinned or where the
    plan runs on a launcher, since every bundled launcher applies one recompute setting to all
    stages (Megatron's --recompute-granularity/-method, DeepSpeed's
    activation_checkpoint_interval, torchtitan's activation_checkpoint.mode), so a stage split
    that mixes modes would be priced as something no launcher runs; free otherwise."""
    if req.pins.recompute == BLOCK_PIN:
        return BLOCK_PIN
    return req.pins.recompute is not None or req.runs_on is not None


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
            if (v > 1 and req.pins.virtual_stages is None
                    and req.model.num_layers % timed.num_chunks):
                # Uneven interleaved chunks run (and are partitioned) when pinned; unpinned, the
                # search leaves them out: their lower bound (search/bound.py) is too weak to
                # prune, so they would cost hundreds of refinements to rule out.
                rejected[UNEVEN_UNPINNED] += len(recomputes) * len(zeros) * len(sps)
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


def launcher_rule(req: Request, par: Parallel) -> str | None:
    """The first rule of ``req.runs_on`` this configuration breaks (None when it runs)."""
    return launcher_allows(req.runs_on, Facts.of(par, req.model))


def stack_rule(stack: Stack, par: Parallel) -> str | None:
    """Why the stack cannot run this configuration's pipeline schedule (None when it can; a
    single stage runs no pipeline schedule)."""
    if par.pp > 1 and par.schedule not in stack.schedules:
        return (f"the {stack.name} stack runs no {par.schedule} schedule (it runs "
                f"{', '.join(stack.schedules)}); choose one of those or another --stack")
    return None


# Megatron-LM arguments.py: "When using MoE and tensor parallelism, sequence parallelism must be
# used" (cost/moe.py prices the dispatch of a GPU's T/tp tokens on that ground).
MOE_NEEDS_SP = "MoE with TP needs sequence parallel"
UNEVEN_UNPINNED = "uneven interleaving (searched when --virtual-stages is pinned)"


def schedule_rule(model: ModelSpec, par: Parallel) -> str | None:
    """Why the pipeline schedule cannot run this way (Megatron's rules), None when it can."""
    layers = len(model.layers)
    if par.num_chunks > layers:
        return f"{par.num_chunks} chunks for {layers} layers: use fewer stages"
    if par.num_chunks > MAX_CHUNKS:  # core/limits.py
        return f"{par.num_chunks} pipeline chunks; at most {MAX_CHUNKS}"
    # Blocks need not divide evenly into pp x v chunks: the partitioner splits interleaved
    # chunks unevenly, and each launcher's own rules refuse what it cannot express.
    return par.schedule_problem()
