"""The catalog listings: `plan models`, `plan hardware`, `plan stacks` (and its components),
each fitted to the terminal with the name whole (planner/report/listing.py)."""

from __future__ import annotations

from dataclasses import fields

from rich.table import Table

from planner.core.text import for_rich
from planner.hardware.profiles import Hardware
from planner.model.spec import ModelSpec
from planner.report.listing import Listing, fitted
from planner.report.plans import si_count
from planner.stack import Component, Stack


def models_table(models: dict[str, ModelSpec], width: int | None = None) -> Table:
    rows = tuple((name, si_count(m.params), str(m.num_layers), str(m.hidden_size),
                  str(m.num_attention_heads), str(m.num_kv_heads), str(m.ffn_hidden_size), m.mlp,
                  str(m.vocab_size), str(m.seq_length)) for name, m in models.items())
    return fitted(Listing(
        "Model presets (plan solve --model NAME)",
        ("name", "params", "layers", "hidden", "heads", "kv", "ffn", "mlp", "vocab", "seq"), rows,
        right=("params", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq"),
        drop_order=("vocab", "mlp", "kv", "ffn", "heads", "hidden", "seq", "layers"),
        caption="every field: plan models show NAME"), width)


def hardware_table(gpus: dict[str, Hardware], width: int | None = None) -> Table:
    rows = tuple((name, f"{hw.peak_tflops:g}",
                  f"{hw.peak_fp8_tflops:g}" if hw.peak_fp8_tflops else "-",  # no FP8 cores
                  f"{hw.memory_gib:g}", f"{hw.memory_bandwidth_gbps:g}",
                  f"{hw.intra_node_gbps:g}", f"{hw.inter_node_gbps:g}", str(hw.gpus_per_node),
                  str(hw.nvlink_domain or hw.gpus_per_node)) for name, hw in gpus.items())
    return fitted(Listing(
        "Bundled GPUs (plan solve --gpu NAME, or --hardware FILE)",
        ("name", "bf16 TF/s", "fp8 TF/s", "GiB", "HBM GB/s", "NVLink GB/s", "net GB/s",
         "GPUs/node", "NVL domain"), rows,
        right=("bf16 TF/s", "fp8 TF/s", "GiB", "HBM GB/s", "NVLink GB/s", "net GB/s",
               "GPUs/node", "NVL domain"),
        drop_order=("NVL domain", "GPUs/node", "fp8 TF/s", "HBM GB/s", "net GB/s"),
        caption="TF/s: dense TFLOP/s; every field and its source: plan hardware --json"), width)


def hardware_sources_lines(sources: dict[str, dict]) -> list[str]:
    """Under the GPU table: the document each profile's figures are read from."""
    lines = ["sources (every field's: plan hardware --json):"]
    for name, src in sources.items():
        lines.append(f"  {for_rich(name)}: {for_rich(src.get('datasheet', 'not given'))}")
    return lines


def hardware_dict(gpus: dict[str, Hardware], sources: dict[str, dict]) -> dict:
    """``plan hardware --json``: each profile's values and the source of each."""
    return {name: {"values": {f.name: getattr(hw, f.name) for f in fields(hw)},
                   "sources": sources.get(name, {})} for name, hw in gpus.items()}


def stacks_table(stacks: dict[str, Stack], width: int | None = None) -> Table:
    """The bundled stacks, one row each, the options that differ most between frameworks."""
    rows = []
    for name, st in stacks.items():
        grads = st.grad_dtype + (f"+fp32@ZeRO{','.join(map(str, st.fp32_grad_accumulation_zero))}"
                                 if st.fp32_grad_accumulation_zero else "")
        overlap = "+".join(k for k, on in (("reduce", st.overlap_grad_reduce),
                                           ("gather", st.overlap_param_gather)) if on) or "off"
        rows.append((name, st.version, st.launcher or "-", st.attention, grads, overlap,
                     "on" if st.tp_comm_overlap else "off",
                     ("scatter" if st.p2p_scatter_gather else "whole")
                     + (",blocking" if st.p2p_blocking else ""),
                     "fused" if st.fused_elementwise else "eager", ",".join(st.schedules)))
    return fitted(Listing(
        "Software stacks (plan solve --stack NAME|FILE; --launcher X picks X's)",
        ("name", "version", "launcher", "attention", "grads", "DP overlap", "TP ovl", "p2p",
         "elementwise", "schedules"), tuple(rows),
        drop_order=("elementwise", "p2p", "TP ovl", "DP overlap", "grads", "attention",
                    "schedules", "launcher"),
        caption="every field and its source: plan stacks --json; files in profiles/stacks/; "
                "what runs over them: plan stacks --components"), width)


def components_table(components: dict[str, Component], width: int | None = None) -> Table:
    """The bundled components, one row each: what they run over and the fields they set."""
    rows = tuple((name, c.version, ",".join(c.over), ", ".join(key for key, _ in c.fields))
                 for name, c in components.items())
    return fitted(Listing(
        "Components (a stack file's \"components\", over its \"base\")",
        ("name", "version", "over", "sets"), rows, wrap=("sets",), drop_order=("version",),
        caption="each field's value and source: plan stacks --components --json; files in "
                "profiles/components/"), width)


def stacks_dict(stacks: dict[str, Stack]) -> dict:
    """``plan stacks --json``: each stack's description, values and sources."""
    return {name: {"version": st.version, "description": st.description,
                   "values": st.values(), "sources": dict(st.sources)}
            for name, st in stacks.items()}


def components_dict(components: dict[str, Component]) -> dict:
    """``plan stacks --components --json``: each component's fields and their sources."""
    return {name: {"version": c.version, "description": c.description, "over": list(c.over),
                   "fields": {k: list(v) if isinstance(v, tuple) else v for k, v in c.fields},
                   "sources": dict(c.sources)}
            for name, c in components.items()}
