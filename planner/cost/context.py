"""Context parallelism (cp): one sequence split over cp GPUs, each holding seq/cp of its tokens.

Everything outside attention is per token, so a CP rank does 1/cp of a layer's matmuls, element-
wise work and activation memory (the layer cost simply runs on seq/cp tokens). Attention is not
per token: every query needs the keys and values (K/V) of the tokens before it, held by other
ranks. How they get there is the stack's ``cp_comm`` (Megatron-Core ``--cp-comm-type``):

- ``p2p`` ring attention (Megatron-Core's default; Transformer Engine
  ``AttnFuncWithCPAndKVP2P``): cp steps; in each, a rank computes attention of its queries
  against the K/V block it holds while it sends that block to the next rank of the ring and
  receives the next one, so the transfer hides behind the block's attention. The backward
  rotates K/V and their gradients (dK, dV) the same way.
- ``a2a`` (Ulysses, Jacobs et al. 2023, "DeepSpeed Ulysses", sec. 3; Megatron-Core
  ``--cp-comm-type a2a``): an all-to-all turns "all heads, seq/cp tokens" into "heads/cp, all
  tokens" for Q, K and V, attention runs locally, and a second all-to-all turns the output back;
  the backward does the same for the gradients. Nothing overlaps it.
- ``allgather`` (PyTorch ``context_parallel``, torchtitan's CP; rotate method ALL_GATHER, the
  default in torch/distributed/tensor/experimental/_context_parallel/_attention.py): K/V are
  all-gathered once, the gather overlapping the first (local) block's attention; the backward
  gathers K/V again and rotates their fp32 gradients around the ring (``_AllToAllRotater``),
  each step behind one block's backward.

Causal load balancing (Megatron-Core ``get_batch_on_this_cp_rank``; torch's head-tail balancer):
the sequence is cut into 2·cp chunks and rank r keeps chunks r and 2cp-1-r, "to ensure load
balancing ... as the causal mask makes later tokens attend to more tokens" (Megatron-LM
docs/source/api-guide/context_parallel.rst). :func:`causal_pairs` counts the query-key pairs each
rank computes: with the balanced split every rank gets exactly (s² + s)/(2·cp) of them, so each
rank executes 1/cp of the causal attention; a contiguous split would leave the last rank
(2cp - 1)/cp times the mean. Megatron needs the sequence divisible by 2·cp for this
(:func:`sequence_problem`).

Hidden transfers are not free: while one runs beside compute it holds SMs the compute cannot use
(comm.overlap_interference), so the layer pays that share of the hidden time, as for DP overlap.
"""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.cost import comm
from planner.cost.comm import Link

CP_COMM_TYPES = ("p2p", "a2a", "allgather")
GRAD_F32_BYTES = 4  # torch's ring backward upcasts dK/dV to fp32 (_cp_options.convert_to_f32)
ACT_BYTES = 2


def held_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks rank ``rank`` keeps (Megatron's balanced split)."""
    return rank, 2 * cp - 1 - rank


def causal_pairs(seq_len: int, cp: int, rank: int, balanced: bool = True) -> int:
    """Query-key pairs (key position <= query position) rank ``rank`` computes under a causal
    mask, the sequence split into 2·cp equal chunks (``balanced``: chunks r and 2cp-1-r, as
    Megatron; otherwise the contiguous half-sequence pair 2r, 2r+1). A query at position i
    attends to i + 1 keys, so chunk k (positions kc .. kc + c - 1) computes c·kc + c(c+1)/2."""
    c = seq_len // (2 * cp)
    chunks = held_chunks(cp, rank) if balanced else (2 * rank, 2 * rank + 1)
    return sum(c * k * c + c * (c + 1) // 2 for k in chunks)


def sequence_problem(seq_len: int, cp: int) -> str | None:
    """Why the sequence cannot be split over cp ranks (None when it can): Megatron-Core cuts it
    into 2·cp chunks for the causal load balancing, so it asserts that the sequence length is
    divisible by 2·cp (megatron/training/utils.py ``get_batch_on_this_cp_rank``: "sequence length
    must be divisible by 2 * context_parallel_size")."""
    if cp > 1 and seq_len % (2 * cp):
        return (f"cp={cp} needs the sequence length ({seq_len}) divisible by 2*cp = {2 * cp} "
                "(the causal load balancing splits it into 2*cp chunks)")
    return None


def heads_problem(num_heads: int, num_kv_heads: int, tp: int, cp: int, cp_comm: str) -> str | None:
    """Why the all-to-all variant cannot split these heads (None when it can): Ulysses gives
    each CP rank heads/cp of the heads a TP rank holds, so the attention heads per TP rank must be
    divisible by cp (Megatron-Core ``--cp-comm-type a2a`` asserts it; Jacobs et al. 2023 sec. 3.1).
    K/V heads fewer than cp are replicated as the all-to-all needs (GQA)."""
    if cp > 1 and cp_comm == "a2a" and (num_heads // tp) % cp:
        return (f"cp={cp} with all-to-all (a2a) context parallelism needs the attention heads per "
                f"TP rank ({num_heads // tp}) divisible by cp")
    return None


def kv_bytes(micro_batch: int, local_seq: int, kv_width: float) -> float:
    """16-bit K and V of the tokens one rank holds (``kv_width`` = KV heads x head dim per TP
    rank)."""
    return 2 * ACT_BYTES * micro_batch * local_seq * kv_width


def overlapped_s(comm_s: float, window_s: float, interference: float) -> float:
    """What a transfer of ``comm_s`` overlapped with ``window_s`` of compute adds: the part that
    does not fit, plus the compute slowed by ``interference`` while the rest runs beside it."""
    exposed = max(0.0, comm_s - window_s)
    return exposed + interference * (comm_s - exposed)


def attention_comm_s(cp: int, cp_comm: str, micro_batch: int, local_seq: int, q_width: float,
                     kv_width: float, link: Link, attn_fwd_s: float, attn_bwd_s: float,
                     interference: float) -> tuple[float, float]:
    """(forward, backward) seconds one layer's CP attention communication adds on one rank.

    ``q_width`` and ``kv_width`` are the query and K/V widths (heads x head dim) per TP rank;
    ``attn_fwd_s`` / ``attn_bwd_s`` the rank's own attention compute, which a ring splits into
    cp equal steps (the balanced split gives every step the same work)."""
    if cp <= 1:
        return 0.0, 0.0
    kv = kv_bytes(micro_batch, local_seq, kv_width)
    step_fwd, step_bwd = attn_fwd_s / cp, attn_bwd_s / cp
    if cp_comm == "p2p":
        # cp - 1 transfers of the held K/V block, each behind one step's attention; the
        # backward sends K/V and dK/dV (twice the bytes) behind each step of the backward.
        fwd = (cp - 1) * overlapped_s(comm.p2p_s(kv, link), step_fwd, interference)
        bwd = (cp - 1) * overlapped_s(comm.p2p_s(2 * kv, link), step_bwd, interference)
        return fwd, bwd
    if cp_comm == "a2a":
        # Q, K, V in and the output back: 16-bit, each rank's share of the tensors it holds.
        q = ACT_BYTES * micro_batch * local_seq * q_width
        moved = 2 * q + kv
        one = comm.all_to_all_s(moved, cp, link)
        return one, one
    if cp_comm == "allgather":
        gather = comm.all_gather_s(cp * kv, cp, link)
        fwd = overlapped_s(gather, step_fwd, interference)
        dkv = comm.p2p_s(kv * GRAD_F32_BYTES / ACT_BYTES, link)
        bwd = overlapped_s(gather, step_bwd, interference) + (cp - 1) * overlapped_s(
            dkv, step_bwd, interference)
        return fwd, bwd
    if cp_comm is None:
        raise PlanInputError(f"cp={cp}: the stack runs no context parallelism (its cp_comm is "
                             "null); choose a stack that does (`plan stacks`)")
    raise PlanInputError(f"unknown context-parallel communication {cp_comm!r}; "
                         f"one of {', '.join(CP_COMM_TYPES)}")


def transient_bytes(cp: int, cp_comm: str, micro_batch: int, local_seq: int, q_width: float,
                    kv_width: float) -> float:
    """Bytes CP attention holds while one layer runs its backward: the ring's K/V and dK/dV
    blocks in flight, double-buffered (p2p: 2 x (K/V + dK/dV)); the gathered K/V of the whole
    sequence and the rotating fp32 gradients (allgather); Q, K, V and output of heads/cp over
    the whole sequence (a2a: as large as the rank's own, re-laid)."""
    if cp <= 1:
        return 0.0
    kv = kv_bytes(micro_batch, local_seq, kv_width)
    if cp_comm == "p2p":
        return 2 * (kv + kv)
    if cp_comm == "allgather":
        return cp * kv + 2 * kv * GRAD_F32_BYTES / ACT_BYTES
    return ACT_BYTES * micro_batch * local_seq * 2 * q_width + kv
