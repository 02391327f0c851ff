"""`plan stacks`: the bundled software stacks, and the named components that run over them."""

from __future__ import annotations

from rich import box
from rich.table import Table

from planner.stack import Component, Stack


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                 padding=(0, 1, 0, 1), collapse_padding=True, caption_justify="left")


def stacks_table(stacks: dict[str, Stack]) -> Table:
    """The bundled stacks, one row each, the options that differ most between frameworks."""
    table = _table("Software stacks (plan solve --stack NAME|FILE; --launcher X picks X's)")
    for col in ("name", "version", "launcher", "attention", "grads", "DP overlap", "TP ovl",
                "p2p", "elementwise", "schedules"):
        table.add_column(col)
    for name, st in stacks.items():
        grads = st.grad_dtype + (f"+fp32@ZeRO{','.join(map(str, st.fp32_grad_accumulation_zero))}"
                                 if st.fp32_grad_accumulation_zero else "")
        overlap = "+".join(k for k, on in (("reduce", st.overlap_grad_reduce),
                                           ("gather", st.overlap_param_gather)) if on) or "off"
        table.add_row(name, st.version, st.launcher or "-", st.attention, grads, overlap,
                      "on" if st.tp_comm_overlap else "off",
                      ("scatter" if st.p2p_scatter_gather else "whole")
                      + (",blocking" if st.p2p_blocking else ""),
                      "fused" if st.fused_elementwise else "eager", ",".join(st.schedules))
    table.caption = ("every field and its source: plan stacks --json; files in profiles/stacks/;"
                     " what runs over them: plan stacks --components")
    return table


def stacks_dict(stacks: dict[str, Stack]) -> dict:
    """``plan stacks --json``: each stack's description, values and sources."""
    return {name: {"version": st.version, "description": st.description,
                   "values": st.values(), "sources": dict(st.sources)}
            for name, st in stacks.items()}


def components_table(components: dict[str, Component]) -> Table:
    """The bundled components, one row each: what they run over and the fields they set."""
    table = _table("Components (a stack file's \"components\", over its \"base\")")
    for col in ("name", "version", "over", "sets"):
        table.add_column(col)
    for name, component in components.items():
        table.add_row(name, component.version, ",".join(component.over),
                      ", ".join(key for key, _ in component.fields))
    table.caption = ("each field's value and source: plan stacks --components --json; files in "
                     "profiles/components/")
    return table


def components_dict(components: dict[str, Component]) -> dict:
    """``plan stacks --components --json``: each component's fields and their sources."""
    return {name: {"version": c.version, "description": c.description, "over": list(c.over),
                   "fields": {k: list(v) if isinstance(v, tuple) else v for k, v in c.fields},
                   "sources": dict(c.sources)}
            for name, c in components.items()}
