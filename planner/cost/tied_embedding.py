"""The tied embedding's gradient all-reduce between the first and the last pipeline stage.

A model whose output head reuses the input embedding's weight (``ModelSpec.tie_embeddings``:
GPT-3, BLOOM; not Llama) keeps a second copy of that weight on the last pipeline stage when the
pipeline has more than one stage. The two copies stay equal only if both stages step on the sum
of their gradients, so every step the two ranks all-reduce the gradient of their vocab/tp x
hidden shard, in the dtype the gradient is held in:

- Megatron-LM (megatron/core/distributed/finalize_model_grads.py, NVIDIA/Megatron-LM commit
  c3d057f5), ``_allreduce_word_embedding_grads``: "Reduce grads across first and last stages to
  ensure that word_embeddings parameters stay in sync." ... "if
  model_module.share_embeddings_and_output_weights: weight =
  model_module.shared_embedding_or_output_weight(); grad = weight.main_grad;
  torch.distributed.all_reduce(grad, group=parallel_state.get_embedding_group())" (the fp32
  main_grad where the stack keeps fp32 gradients). ``finalize_model_grads`` runs it after the
  data-parallel sync ("for model_chunk in model: model_chunk.finish_grad_sync()" comes first)
  as a plain blocking call: nothing overlaps it.
- DeepSpeed (deepspeed/runtime/pipe/engine.py, microsoft/DeepSpeed commit 195563a2),
  ``_exec_reduce_tied_grads``: "for weight, group in weight_group_list: grad = weight._hp_grad if
  self.bfloat16_enabled() else weight.grad; dist.all_reduce(grad, group=group)" (``_hp_grad``:
  BF16_Optimizer's fp32 accumulation buffer); TrainSchedule issues it after the last backward
  and before the data-parallel reduce (deepspeed/runtime/pipe/schedule.py, commit 077e6740:
  "cmds.append(ReduceTiedGrads()); cmds.append(ReduceGrads()); cmds.append(OptimizerStep())").

Both run it after the pipeline has drained, so the step pays it in full on the two ranks that
hold the embedding and the head (predict/step.py adds it to their exposed sync). With one stage,
or DualPipe (whose rank 0 holds both the first and the last stage), the head's weight is the
embedding's on the same GPU and nothing is exchanged.

The same all-reduce keeps the embedding copy of multi-token prediction in step: an untied model
with MTP modules (DeepSeek-V3; model/spec.py Layer.mtp_copies_embedding) stores a copy of the
embedding on the head's stage for them (cost/mtp.py), and Megatron-Core all-reduces its gradient
over the same embedding group (megatron/core/distributed/finalize_model_grads.py,
NVIDIA/Megatron-LM commit 00c2c0ad, ``_allreduce_word_embedding_grads``: "If use Multi-Token
Prediction (MTP), we also need to maintain duplicated embedding weights in mtp process stage. So
we need to allreduce grads of embedding in the embedding group in these cases." ... "if
model_module.share_embeddings_and_output_weights or getattr(config, 'mtp_num_layers', 0):").
Under DualPipe the copy is the embedding itself (DeepSeek-V3 report sec. 3.2.3, "we deploy the
shallowest layers (including the embedding layer) and deepest layers (including the output head)
of the model on the same PP rank. This arrangement enables the physical sharing of parameters
and gradients, of the shared embedding and output head, between the MTP module and the main
model"): nothing is exchanged, as for a tied head.
"""

from __future__ import annotations

from planner.cost import comm, nccl
from planner.core.parallel import Parallel
from planner.hardware.profiles import Cluster
from planner.layout.ranks import stage_hop_crosses_nodes
from planner.model.spec import ModelSpec
from planner.stack.spec import DTYPE_BYTES, Stack


def synced(model: ModelSpec, par: Parallel) -> bool:
    """Whether this configuration all-reduces an embedding gradient between the first and last
    stage: a tied model, or one whose MTP modules copy the embedding, with the embedding and
    the head on different ranks (more than one stage, and not DualPipe)."""
    head = model.layers[-1] if model.layers else None
    copies = model.tie_embeddings or (head is not None and head.mtp_copies_embedding)
    return copies and par.pp > 1 and not par.schedule_traits.mirrored


def grad_bytes(model: ModelSpec, par: Parallel, opts: Stack) -> float:
    """Bytes each of the two ranks all-reduces: its shard of the padded vocabulary (Megatron's
    vocab-parallel embedding, vocab/tp rows) x hidden, in the dtype the gradient is held in (the
    fp32 accumulation buffer where the stack keeps one at this ZeRO stage, as DeepSpeed's
    ``_hp_grad``; else the stack's gradient dtype, Megatron's main_grad); 0 where nothing is
    exchanged (:func:`synced`)."""
    if not synced(model, par):
        return 0.0
    element = 4 if opts.fp32_accumulation(par.zero) else DTYPE_BYTES[opts.grad_dtype]
    return model.padded_vocab_size(par.tp) / par.tp * model.hidden_size * element


def embedding_group(par: Parallel, cluster: Cluster) -> nccl.Group:
    """The two-rank embedding group as NCCL sees it: the first and last stage's ranks of the
    same (tp, cp, dp) coordinates (layout/ranks.py embedding_groups). Across nodes (or NVLink
    domains) each member runs at its share of its node's NICs, every GPU of the stage running
    its own group's all-reduce at once (comm.group_link, one member per node)."""
    domain = cluster.nvlink_domain
    crosses = cluster.gpus > domain and stage_hop_crosses_nodes(
        0, par.pp - 1, par.tp * par.cp, par.dp, domain)
    concurrent = max(1, min(cluster.gpus_per_node, par.tp * par.cp * par.dp))
    link = comm.group_link(cluster.hardware, 1, crosses, groups_per_node=concurrent)
    return nccl.Group(ranks=2, nodes=2 if crosses else 1, bus_bytes_per_s=link.bytes_per_s)


def sync_s(model: ModelSpec, par: Parallel, cluster: Cluster, opts: Stack) -> float:
    """Seconds of the tied embedding's gradient all-reduce (NCCL's choice of algorithm and
    protocol for its size, cost/nccl.py); 0 where nothing is exchanged."""
    nbytes = grad_bytes(model, par, opts)
    if nbytes <= 0:
        return 0.0
    return float(nccl.collective_s("all_reduce", nbytes, embedding_group(par, cluster)))
