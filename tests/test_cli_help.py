"""The CLI's help: grouped options, one meaning per short option, flags without value
placeholders, defaults shown, progress counts only once the total is known."""

import re

import typer.main
from rich.progress import Progress
from typer.testing import CliRunner

import cli
from planner.cli import common

runner = CliRunner()


def _commands():
    group = typer.main.get_command(cli.app)
    return group.commands


def test_a_short_option_means_the_same_long_option_in_every_command():
    meaning: dict[str, tuple[str, str]] = {}
    for name, command in _commands().items():
        for param in command.params:
            if param.param_type_name != "option":
                continue
            shorts = [o for o in param.opts if not o.startswith("--")]
            longs = [o for o in param.opts if o.startswith("--")]
            for short in shorts:
                if short in meaning:
                    assert meaning[short][0] == longs[0], (
                        f"{short} is {meaning[short][0]} in {meaning[short][1]} but {longs[0]} "
                        f"in {name}")
                meaning[short] = (longs[0], name)
    assert meaning["-m"][0] == "--model" and meaning["-M"][0] == "--microbatches"


def test_solve_help_groups_its_options_and_renders_flags_and_defaults():
    result = runner.invoke(cli.app, ["solve", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    text = result.output
    for panel in (common.PLAN, common.PINS, common.LIMITS, common.OUTPUT):
        assert f"─ {panel} " in text
    flags = [line for line in text.splitlines()
             if re.search(r"--(json|wide|force|explain|flash|overlap|sequence-parallel)\b", line)
             and "│" in line]
    assert flags and not any("<bool>" in line for line in flags)
    assert "[default: (llama3-8b)]" in text and "[default: auto]" in text and "[default: 10]" in text


def test_every_boolean_flag_has_no_value_placeholder():
    for name, command in _commands().items():
        for param in command.params:
            if getattr(param, "is_flag", False) and param.name != "help":
                assert param.metavar == "", f"{name} {param.opts[0]} renders a placeholder"


def test_progress_count_is_blank_until_the_total_is_known():
    progress = Progress()
    task = progress.add_task("x", total=None)
    column = common._Count()
    assert column.render(progress.tasks[task]).plain == ""
    progress.update(task, completed=3, total=7)
    assert column.render(progress.tasks[task]).plain == "3/7"
