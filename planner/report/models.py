"""`plan models show`: one model as a model.json template, field by field.

Floor 7 (report/). The rows come from planner.model.template.FIELDS, so the table,
docs/model-files.md and the loader describe the same format.
"""

from __future__ import annotations

import json

from rich.table import Table

from planner.core.text import for_rich
from planner.model.template import FIELDS, model_template
from planner.model.spec import ModelSpec


def template_table(spec: ModelSpec) -> Table:
    """Every model.json field with this model's value, the loader's default and its meaning."""
    doc = model_template(spec)
    name = for_rich(spec.name)  # a name from a file: printed, never read as markup
    table = Table(title=f"{name} as a model.json (plan models show {name} --json > "
                        "model.json)", title_justify="left")
    for col in ("field", "value", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for f in FIELDS:
        if f.name in doc:
            table.add_row(f.name, for_rich(json.dumps(doc[f.name])), f.default, f.meaning)
    if "layers" in doc:
        table.add_row("layers", f"{len(doc['layers'])} layers (see --json)", "", "")
    return table


def parameters_line(spec: ModelSpec) -> str:
    """``mixtral-8x7b: 46.70B parameters, 12.88B active per token``: what a model card leads
    with, before the fields."""
    from planner.report.plans import si_count
    text = f"{for_rich(spec.name)}: {si_count(spec.params)} parameters"
    if spec.is_moe:
        text += f", {si_count(spec.active_params)} active per token"
    return text
