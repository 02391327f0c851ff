"""The rules a configuration must pass before any prediction, each answering why it cannot run
(None when it can): TP stays inside an NVLink domain and divides heads, KV heads and FFN; context
parallelism needs a stack that runs it, flash attention and a sequence it divides; experts split
by divisors, and MoE with TP needs sequence parallel; the stack runs the pipeline schedule; pp·v
chunks need at least as many layers and the schedule's own rules (Megatron's); the launcher the
plan runs on can express it. The space (planner/search/space.py) counts each rejection by reason.
"""

from __future__ import annotations

from planner.core.limits import MAX_CHUNKS
from planner.cost import context
from planner.launchers import Facts, launcher_allows
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.core.parallel import Parallel
from planner.search.request import Request
from planner.stack import Stack


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
