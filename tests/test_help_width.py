"""Every `plan ... --help` reads whole at 80 columns (#33 item 1): no option name or other text
cut with an ellipsis, no value placeholder on --help, no line past 80 characters, and no line of a
command's help text wrapped where it also breaks as written (a ragged paragraph, an example
command cut in two)."""

import inspect

import pytest
import typer.main
from typer.testing import CliRunner

import cli

runner = CliRunner()

def _commands(command=None, path=()):
    """(path, click command) for the app and every command and subcommand under it."""
    command = command or typer.main.get_command(cli.app)
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, path + (name,))


COMMANDS = list(_commands())


def test_every_command_is_covered():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "solve", "sweep", "partition", "validate", "models", "models show"} <= names


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "plan" for p, _ in COMMANDS])
def test_help_fits_80_columns(path, command):
    result = runner.invoke(cli.app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Usage:" in text
    assert "…" not in text, text
    assert "<bool>" not in text, text
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, "\n".join(long)
    rendered = [line.strip(" │") for line in text.splitlines()]
    for line in _unwrappable_lines(command.help or ""):
        assert any(line in shown for shown in rendered), f"wraps at 80 columns: {line!r}"


def _unwrappable_lines(help_text: str):
    """The lines of a help text that must show whole: an example command, and each line of a
    paragraph written on several lines (typer keeps its line breaks, so a wrap makes it ragged).
    A one-line paragraph of prose may wrap."""
    for paragraph in inspect.cleandoc(help_text).split("\n\n"):
        lines = [line.strip().replace("\\[", "[") for line in paragraph.splitlines()]
        lines = [line for line in lines if line]
        for line in lines:
            if len(lines) > 1 or line.startswith(("plan ", "Example")):
                yield line
