"""`plan models`, `plan models show`, `plan stacks`, `plan hardware`: what the planner knows."""

from __future__ import annotations

import typer

from planner import api
from planner.cli.common import _flag, app, out, print_json, user_errors


models_app = typer.Typer(help="List the model presets, or show one as a model.json template.")


app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
def models(ctx: typer.Context):
    """List the model presets with their parameter counts.

    Example: plan models show llama3-8b --json > model.json
    """
    from planner.report.catalog import models_table  # lazy on purpose: not for `plan --help`

    if ctx.invoked_subcommand is None:
        out.print(models_table(api.models(), out.width))


@models_app.command("show")
def models_show(
    name: str = typer.Argument(..., help="A preset (plan models), model.json or HF config.json."),
    as_json: bool = _flag(False, "--json", "Print the model.json itself."),
):
    """Show a model as a model.json template: every field, its value and meaning.

    Examples:\n
      plan models show llama3-8b\n
      plan models show llama3-8b --json > my-model.json\n
      plan models show config.json --json   (a HuggingFace config as a model.json)
    """
    from planner.report.models import parameters_line, template_table  # lazy on purpose

    with user_errors(as_json):
        spec = api.model(name)
        if as_json:
            print_json(api.model_template(spec))
        else:
            out.print(parameters_line(spec), highlight=False)
            out.print(template_table(spec))


@app.command("stacks")
def stacks_cmd(as_json: bool = _flag(False, "--json", "Every field and its source, as JSON."),
               components: bool = _flag(False, "--components",
                                        "The named components that run over the stacks "
                                        "(a stack file's \"components\").")):
    """List the bundled software stacks (plan solve --stack NAME, or --stack FILE).

    Examples: plan stacks; plan stacks --json; plan stacks --components
    """
    from planner.report.catalog import (components_dict, components_table,  # lazy on purpose
                                        stacks_dict, stacks_table)

    with user_errors(as_json):
        found = api.components() if components else api.stacks()
        if as_json:
            print_json((components_dict if components else stacks_dict)(found))
        else:
            out.print((components_table if components else stacks_table)(found, out.width))


@app.command("hardware")
def hardware_cmd(as_json: bool = _flag(False, "--json", "Every field and its source, as JSON.")):
    """List the bundled GPU profiles and the vendor document each is read from."""
    from planner.report.catalog import (hardware_dict, hardware_sources_lines,  # lazy on purpose
                                        hardware_table)

    with user_errors(as_json):
        gpus, sources = api.hardware_profiles(), api.hardware_sources()
        if as_json:
            print_json(hardware_dict(gpus, sources))
            return
        out.print(hardware_table(gpus, out.width))
        for line in hardware_sources_lines(sources):
            out.print(line, highlight=False, soft_wrap=True)
