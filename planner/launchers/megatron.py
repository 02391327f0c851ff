"""Megatron-LM arguments (``megatron_args.sh``) for ``pretrain_gpt.py``, and their parser.

Targets Megatron-LM core_r0.13 with megatron-core 0.13.1, the release the ``megatron-core`` stack
prices (one version per stack: the one exported). Flag names from Megatron-LM
``megatron/training/arguments.py`` (validate_args, the _add_*_args groups and
core_transformer_config_from_args; the stored NVIDIA revision 000c4ac) and megatron-core
0.13.1's ``transformer_config.py`` / ``transformer_block.py`` /
``pipeline_parallel_layer_layout.py``; tests/test_engine_megatron.py builds megatron-core 0.13.1's
own config objects from the exported file and reads back what it would run
(planner/engine/megatron_config.py). The model's flags are in megatron_model.py.

- uneven stages: Megatron counts transformer blocks only. Equal blocks per chunk need no flag
  (interleaved: ``--num-layers-per-virtual-pipeline-stage``); without interleaving, when only
  the first and/or last stage differ, ``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers``; otherwise ``--pipeline-model-parallel-layout`` with one
  ``|``-separated entry per chunk in model order: ``E`` embedding, ``t`` a decoder block (``t*k``
  repeats), ``L`` the loss/head. Interleaved plans always take the layout: megatron-core 0.13.1's
  get_num_layers_to_build gives ``num_layers_in_first_pipeline_stage`` "for all virtual pipeline
  parallel stages within the first (last) pipeline parallel stage", split evenly across them,
  which is not the plan's first chunk.
- rules (each refused with its reason by :func:`check`): no GPipe or ZB-H1 schedule in stock
  Megatron; the interleaved schedule raises unless microbatches % pp == 0 (schedules.py), and
  validate_args asserts pp > 2 for it only without p2p overlap, which Megatron-LM turns on by
  default ("'--no-overlap-p2p-communication', action='store_false'"), so pp = 2 runs; the
  classic DDP path has ZeRO-1
  only (``--use-distributed-optimizer``); ``--use-torch-fsdp2`` asserts pp == 1 and
  Megatron-FSDP is outside this target, so ZeRO-2/3 are refused.
"""

from __future__ import annotations

import re
import shlex

from planner.core.schedules import INTERLEAVED, ONE_F_ONE_B, find_schedule
from planner.cost import context
from planner.launchers.common import (Facts, block_counts, header, is_standard_gpt,
                                      launched_recompute, recompute_problems, schedule_basics,
                                      structure_problems, tp_divisibility)
from planner.launchers.megatron_model import (architecture_problems, max_positions, moe_flags,
                                              rope_flags)
from planner.launchers.quoting import sh_word
from planner.stack import userbuffers
from planner.predict.plan import Plan

TARGET = "Megatron-LM core_r0.13, megatron-core 0.13.1 (pretrain_gpt.py arguments)"
FILENAME = "megatron_args.sh"
NAME = "Megatron-LM"


def parallel_rules(f: Facts) -> list[str]:
    """Megatron-LM's rules over plain values; vocab is padded by Megatron, so it is not checked."""
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, None, NAME)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
    traits = find_schedule(f.schedule)
    if f.pp > 1 and traits and not traits.megatron:
        if traits.split_backward:
            out.append(f"{NAME}: zero-bubble {traits.title} is not in stock Megatron-LM; choose "
                       "1f1b or interleaved")
        elif traits.mirrored:
            out.append(f"{NAME} has no {traits.title} schedule (DeepSeek's bidirectional "
                       "pipeline runs in deepseek-ai/DualPipe and DeepSeek's own HAI-LLM); "
                       "choose 1f1b or interleaved")
        else:
            out.append(f"{NAME} has no {traits.title} schedule (it runs 1F1B or interleaved "
                       "1F1B); choose --schedule 1f1b")
    if (traits and traits.microbatches_divisible_by_pp and f.pp > 1
            and f.num_microbatches % f.pp):
        out.append(f"{NAME}: the interleaved schedule needs microbatches ({f.num_microbatches}) "
                   f"divisible by pp ({f.pp})")
    if f.zero >= 2:
        out.append(f"{NAME}: ZeRO-{f.zero} is not available (the distributed optimizer is ZeRO-1; "
                   "torch FSDP2 refuses pipeline parallelism); use zero <= 1")
    chunks = f.pp * f.virtual_stages
    if f.num_blocks is not None and f.virtual_stages > 1 and chunks > f.num_blocks + 2:
        out.append(f"{NAME}: {chunks} model chunks for {f.num_blocks} blocks")
    return out


def check(plan: Plan) -> list[str]:
    """Every Megatron rule the plan breaks (empty when it can be launched as is)."""
    par, m = plan.parallel, plan.model
    out = structure_problems(plan) + recompute_problems(plan, NAME, block_method=True)
    if not is_standard_gpt(plan):
        out.append(f"{NAME} builds embedding + transformer blocks + head only; this model has "
                   "other layer kinds")
    out += parallel_rules(Facts.of(par, m))
    out += architecture_problems(m)
    out += precision_rules(m, plan.stack)
    out += attention_rules(plan.stack)
    out += overlap_rules(plan.stack)
    if par.cp > 1:  # get_batch_on_this_cp_rank's 2*cp chunks (cost/context.py)
        out += [f"{NAME}: {p}" for p in (context.sequence_problem(m.seq_length, par.cp),
                                         context.heads_problem(m.num_attention_heads,
                                                               m.num_kv_heads, par.tp, par.cp,
                                                               getattr(plan.stack, "cp_comm",
                                                                       "p2p")))
                if p]
    return out


def precision_rules(model, stack) -> list[str]:
    """The stack's FP8 recipe must be one Megatron-LM has (FP8_RECIPES)."""
    if stack is not None and stack.precision == "fp8" and stack.fp8_recipe not in FP8_RECIPES:
        return [f"{NAME}: --fp8-recipe has no {stack.fp8_recipe} scaling (tensorwise, delayed, "
                "mxfp8, blockwise); price the plan with fp8_recipe delayed, current or blockwise"]
    return []


def attention_rules(stack) -> list[str]:
    """--attention-backend flash runs FlashAttention-2-class kernels; a plan priced on another
    flash kernel (Stack.attention_kernel, cost/attention_kernel.py) would launch faster than
    priced, so it is refused."""
    if stack is not None and stack.flash_attention and stack.attention_kernel != "flash2":
        return [f"{NAME}: --attention-backend has no {stack.attention_kernel} kernel; price the "
                "plan with attention_kernel flash2"]
    return []


def overlap_rules(stack) -> list[str]:
    """--tp-comm-overlap alone runs Transformer Engine's default userbuffer settings
    (Megatron-LM passes ub_cfgs = {} without --tp-comm-overlap-cfg); a plan priced on other
    per-GEMM settings (Stack.tp_overlap_ub, cost/tp_overlap.py) would launch differently from
    how it was priced, and the export writes no --tp-comm-overlap-cfg file, so it is refused."""
    if stack is not None and stack.tp_comm_overlap and stack.tp_overlap_ub is not None \
            and stack.tp_overlap_ub != userbuffers.parse({}, "TE's defaults"):
        return [f"{NAME}: the stack's tp_overlap_ub settings need --tp-comm-overlap-cfg, which "
                "the export does not write; price the plan with tp_overlap_ub {} (TE's defaults)"]
    return []


def pipeline_flags(plan: Plan) -> list[tuple[str, str | None]]:
    """The flags that give Megatron the plan's stage split (block counts per chunk)."""
    par = plan.parallel
    counts = block_counts(plan)
    v, chunks = par.virtual_stages, len(counts)
    if chunks <= 1:
        return []
    if len(set(counts)) == 1:
        return [("--num-layers-per-virtual-pipeline-stage", str(counts[0]))] if v > 1 else []
    if v > 1:  # first/last counts are per pipeline rank, over all its chunks (module doc)
        return [("--pipeline-model-parallel-layout", layout_string(plan))]
    middle = counts[1:-1]
    if chunks >= 3 and len(set(middle)) == 1 and middle[0] > 0 and counts[0] > 0 \
            and counts[-1] > 0:
        flags = []
        if counts[0] != middle[0]:
            flags.append(("--decoder-first-pipeline-num-layers", str(counts[0])))
        if counts[-1] != middle[0]:
            flags.append(("--decoder-last-pipeline-num-layers", str(counts[-1])))
        return flags
    return [("--pipeline-model-parallel-layout", layout_string(plan))]


def layout_string(plan: Plan) -> str:
    """Megatron's pipeline layout: chunk entries in model order, e.g. ``Et*3|t*4|t*3L``."""
    n = len(plan.model.layers)
    entries = []
    for s, blocks in zip(plan.stages, block_counts(plan)):
        body = "t" * blocks if blocks <= 2 else f"t*{blocks}"
        entries.append(("E" if s.first == 0 else "") + body + ("L" if s.last == n else ""))
    return "|".join(entries)


def args(plan: Plan) -> list[tuple[str, str | None]]:
    """(flag, value) pairs in a stable order; value None for a switch."""
    par, m = plan.parallel, plan.model
    out: list[tuple[str, str | None]] = [
        ("--tensor-model-parallel-size", str(par.tp)),
        ("--pipeline-model-parallel-size", str(par.pp)),
    ]
    if par.cp > 1:  # the K/V exchange the stack priced (cost/context.py): --cp-comm-type
        out.append(("--context-parallel-size", str(par.cp)))
        if plan.stack is not None and plan.stack.cp_comm not in (None, "p2p"):
            out.append(("--cp-comm-type", plan.stack.cp_comm))
    if par.sequence_parallel:
        out.append(("--sequence-parallel", None))
    out += pipeline_flags(plan)
    out += [("--micro-batch-size", str(par.micro_batch)),
            ("--global-batch-size", str(par.global_batch)),
            ("--num-layers", str(m.num_layers)),
            ("--hidden-size", str(m.hidden_size)),
            ("--num-attention-heads", str(m.num_attention_heads))]
    if m.num_kv_heads < m.num_attention_heads:
        out += [("--group-query-attention", None), ("--num-query-groups", str(m.num_kv_heads))]
    if m.head_dim and m.head_dim * m.num_attention_heads != m.hidden_size:
        out.append(("--kv-channels", str(m.head_dim)))  # Megatron's default is hidden / heads
    if m.qkv_bias:
        out.append(("--add-qkv-bias", None))
    if m.qk_norm == "head":
        out.append(("--qk-layernorm", None))
    out += moe_flags(plan)
    out += [("--ffn-hidden-size", str(m.ffn_hidden_size)),
            ("--seq-length", str(m.seq_length)),
            ("--max-position-embeddings", str(max_positions(m)))]
    if m.mlp == "swiglu":
        out.append(("--swiglu", None))
    if m.norm == "rmsnorm":
        out += [("--normalization", "RMSNorm")]
    if not m.bias:
        out.append(("--disable-bias-linear", None))
    out += rope_flags(m)
    # the padding the plan priced (Megatron's default is 128)
    out.append(("--make-vocab-size-divisible-by", str(m.make_vocab_size_divisible_by)))
    if not m.tie_embeddings:
        out.append(("--untie-embeddings-and-output-weights", None))
    out += recompute_flags(launched_recompute(plan))
    if par.zero >= 1:
        out.append(("--use-distributed-optimizer", None))
    if not m.dropout:  # Megatron's defaults are 0.1; the plan's model trains without dropout
        out += [("--attention-dropout", "0"), ("--hidden-dropout", "0")]
    out += stack_flags(plan)
    return out


def recompute_flags(setting) -> list[tuple[str, str | None]]:
    """Megatron's recompute arguments for the plan's one setting (check() refuses a plan without
    one). Megatron-LM arguments.py: '--recompute-method' "1) uniform: uniformly divide the total
    number of Transformer layers and recompute the input activation of each divided chunk at
    specified granularity. 2) recompute the input activations of only a set number of individual
    Transformer layers per pipeline stage and do the rest without any recomputing";
    '--recompute-num-layers' "1) uniform: the number of Transformer layers in each uniformly
    divided recompute unit, 2) block: the number of individual Transformer layers to recompute
    within each pipeline stage." Uniform with one layer per unit recomputes every block; block N
    the first N of every model chunk (each chunk builds its own TransformerBlock,
    transformer_block.py ``if l < self.config.recompute_num_layers``)."""
    if setting is None or setting.mode == "none":
        return []
    if setting.mode == "selective":
        return [("--recompute-granularity", "selective")]
    method, layers = ("uniform", 1) if setting.blocks is None else ("block", setting.blocks)
    return [("--recompute-granularity", "full"), ("--recompute-method", method),
            ("--recompute-num-layers", str(layers))]


def stack_flags(plan: Plan) -> list[tuple[str, str | None]]:
    """What the plan's stack assumed, as Megatron arguments: precision, attention kernel, and
    the overlaps (--overlap-grad-reduce exactly when the stack overlaps the gradient reduce;
    --overlap-param-gather needs the distributed optimizer)."""
    stack, par = plan.stack, plan.parallel
    if stack is None:
        return [("--bf16", None)]
    out: list[tuple[str, str | None]] = [(f"--{stack.param_dtype}", None),
                                         ("--attention-backend", stack.attention)]
    if stack.overlap_grad_reduce:
        out.append(("--overlap-grad-reduce", None))
    if stack.overlap_param_gather and par.zero >= 1:
        out.append(("--overlap-param-gather", None))
    if stack.tp_comm_overlap and par.tp > 1:
        out.append(("--tp-comm-overlap", None))
    if stack.precision == "fp8":
        out += fp8_flags(stack)
    return out


# The stack's FP8 recipe as Megatron-LM's --fp8-recipe (megatron/training/arguments.py:
# "--fp8-recipe', default='delayed', choices=['tensorwise', 'delayed', 'mxfp8', 'blockwise']").
# Format: "hybrid" (E4M3 forward, E5M2 gradients; Transformer Engine's Format.HYBRID) for the
# per-tensor recipes; block scaling runs E4M3 on every tensor (DeepSeek-V3 §3.3.2: "we adopt
# the E4M3 format on all tensors for higher precision").
FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise", "blockwise": "blockwise"}


def fp8_flags(stack) -> list[tuple[str, str | None]]:
    fmt = "e4m3" if stack.fp8_recipe == "blockwise" else "hybrid"
    out = [("--fp8-format", fmt), ("--fp8-recipe", FP8_RECIPES[stack.fp8_recipe])]
    # FP8 primary weights: "--fp8-param-gather ... Keep the compute param in fp8 (do not use
    # any other intermediate dtype) and perform the param all-gather in fp8."
    return out + [("--fp8-param-gather", None)] if stack.fp8_params else out


def render(plan: Plan) -> dict[str, str]:
    """``megatron_args.sh``: a bash array MEGATRON_ARGS to append to the user's own arguments."""
    lines = [header(plan, TARGET),
             "# Source this file and pass \"${MEGATRON_ARGS[@]}\" to pretrain_gpt.py, together "
             "with your data,\n# tokenizer, optimizer and checkpoint arguments. With tp > 1 "
             "Megatron expects CUDA_DEVICE_MAX_CONNECTIONS=1.\n"]
    par = plan.parallel
    lines.append(f"PLAN3D_WORLD_SIZE={par.gpus}  # tp*pp*dp; Megatron derives dp = "
                 f"world size / (tp*pp) = {par.dp}\n")
    lines.append("MEGATRON_ARGS=(\n")
    for flag, value in args(plan):
        lines.append(f"  {flag}" + (f" {sh_word(value)}" if value is not None else "") + "\n")
    lines.append(")\n")
    return {FILENAME: "".join(lines)}



def entry(plan: Plan) -> dict:
    """plan.json's ``engines.megatron``: the layout string, or the rule the plan breaks."""
    problems = check(plan)
    if problems:
        return {"target": TARGET, "supported": False, "rule": problems[0]}
    return {"target": TARGET, "supported": True,
            "pipeline_model_parallel_layout": layout_string(plan),
            "split_flags": [flag if value is None else f"{flag} {value}"
                            for flag, value in pipeline_flags(plan)]}

# --- parsing back ---------------------------------------------------------------------------------

def megatron_words(text: str) -> list[str]:
    """The words of the MEGATRON_ARGS=( ... ) array, or of the whole text when there is none."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("MEGATRON_ARGS=(")),
                 None)
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == ")"),
                   len(lines))
        lines = lines[start + 1:end]
    return shlex.split("\n".join(lines), comments=True)


def _expand_layout(layout: str) -> list[str]:
    """Unroll ``(…)*n`` and ``x*n`` the way Megatron does, then split on ``|``."""
    layout = layout.replace(",", "")
    layout = re.sub(r"\(([^)]+)\)\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), layout)
    layout = re.sub(r"(.)\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), layout)
    return layout.split("|")


def parse_megatron_args(text: str) -> dict:
    """Read a Megatron argument text back into the parallel configuration it sets.

    Returns tp, pp, dp (when PLAN3D_WORLD_SIZE is given), micro_batch, global_batch,
    num_microbatches (when dp is known), sequence_parallel, virtual_stages, schedule, recompute,
    zero (1 with the distributed optimizer, else 0), first/last stage block counts, the layout
    string if any, ``stage_blocks``: transformer blocks per chunk in model order, and the expert
    split (ep, etp: 1 and tp where not given; num_experts and moe_top_k: None for a dense model).
    """
    tokens = megatron_words(text)
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                flags[tok] = tokens[i + 1]
                i += 2
                continue
            flags[tok] = None
        i += 1
    world = re.search(r"^\s*PLAN3D_WORLD_SIZE=(\d+)", text, re.M)

    def num(flag: str, default: int | None = None) -> int | None:
        return int(flags[flag]) if flags.get(flag) is not None else default

    tp = num("--tensor-model-parallel-size", 1)
    pp = num("--pipeline-model-parallel-size", 1)
    blocks = num("--num-layers")
    layout = flags.get("--pipeline-model-parallel-layout")
    first = num("--decoder-first-pipeline-num-layers")
    last = num("--decoder-last-pipeline-num-layers")
    if layout is not None:
        chunks = _expand_layout(layout)
        v = len(chunks) // pp
        stage_blocks = [c.count("t") for c in chunks]
    else:
        if num("--num-virtual-stages-per-pipeline-rank") is not None:
            v = num("--num-virtual-stages-per-pipeline-rank")
        elif num("--num-layers-per-virtual-pipeline-stage") is not None:
            v = blocks // (pp * num("--num-layers-per-virtual-pipeline-stage"))
        else:
            v = 1
        # Megatron's first/last counts are per pipeline rank, split evenly over its v chunks
        ranks = [None] * pp
        ranks[0], ranks[-1] = (first, last) if pp > 1 else (first if first is not None else last,
                                                            None)
        rest = blocks - sum(r for r in ranks if r is not None)
        free = sum(r is None for r in ranks)
        ranks = [r if r is not None else rest // free for r in ranks]
        stage_blocks = [ranks[c % pp] // v for c in range(pp * v)]
    granularity = flags.get("--recompute-granularity")
    method = flags.get("--recompute-method")
    out = {
        "tp": tp, "pp": pp, "cp": num("--context-parallel-size", 1),
        "cp_comm": flags.get("--cp-comm-type") or "p2p",
        "micro_batch": num("--micro-batch-size"),
        "global_batch": num("--global-batch-size"),
        "sequence_parallel": "--sequence-parallel" in flags,
        "virtual_stages": v, "schedule": INTERLEAVED.name if v > 1 else ONE_F_ONE_B.name,
        "recompute": granularity or "none",
        # Megatron's block method: the first N blocks of every stage recompute
        "recompute_layers": (num("--recompute-num-layers")
                             if granularity == "full" and method == "block" else None),
        "zero": 1 if "--use-distributed-optimizer" in flags else 0,
        "first_stage_layers": first, "last_stage_layers": last, "layout": layout,
        "num_layers": blocks, "stage_blocks": stage_blocks,
        "rotary_base": float(flags["--rotary-base"]) if flags.get("--rotary-base") else None,
        "overlap_grad_reduce": "--overlap-grad-reduce" in flags,
        "overlap_param_gather": "--overlap-param-gather" in flags,
        "tp_comm_overlap": "--tp-comm-overlap" in flags,
        "ep": num("--expert-model-parallel-size", 1),
        "etp": num("--expert-tensor-parallel-size", tp),
        "num_experts": num("--num-experts"), "moe_top_k": num("--moe-router-topk"),
        "attention": flags.get("--attention-backend"),
        "param_dtype": "bf16" if "--bf16" in flags else "fp16" if "--fp16" in flags else None,
        "fp8_format": flags.get("--fp8-format"), "fp8_recipe": flags.get("--fp8-recipe"),
        "fp8_param_gather": "--fp8-param-gather" in flags,
        "dropout": not (flags.get("--attention-dropout") == "0"
                        and flags.get("--hidden-dropout") == "0"),
    }
    if world:
        out["dp"] = int(world.group(1)) // (tp * out["cp"] * pp)
        if out["micro_batch"] and out["global_batch"]:
            out["num_microbatches"] = out["global_batch"] // (out["micro_batch"] * out["dp"])
    return out
