"""How `plan ... --help` is laid out: every command's help readable at 80 columns.

Typer draws each panel of options as a rich table with one column per part: the option, its short
form, its negative form (``--no-sequence-parallel``), the negative's short form, the value type and
the help. When the panel is wider than the terminal, rich narrows the widest columns first: the
help text down to the width of the longest option name, and then both together, so at 80 columns
``--global-batch-range`` and ``--no-sequence-parallel`` were cut to ``--global-batch-ran…``.
A one-space gutter between columns (two before) gives back one character per column, which is
what the widest panels lacked; option names are left as users and the docs know them. (The
commands panel keeps typer's two spaces: its name column has a fixed width and is never cut.)

Typer 0.29 also gives the help option itself a value placeholder (``--help <bool>``): the group
class below clears it, as :func:`planner.cli.common._flag` does for every other flag.

Start-up (issue #32 item 4; benchmarks/bench_startup.py): typer's help renderer
(``typer.rich_utils``, with rich.markdown and markdown-it: ~0.1 s here) is imported, and the gutter
set, only when a help page is drawn, which every help goes through ``Context.get_help`` to do;
a command that runs draws none. And a help option not given reads False, not typer's None: a
flag's bool is taken as it is, where None went through typer's pydantic coercion, whose import
(~0.15 s) `plan solve --help` and the flag-only commands then paid for nothing.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

# (top, right, bottom, left): one space after each column, none before; typer's own is (0, 1),
# a space either side. The panel's edges keep no padding (pad_edge is False).
GUTTER = (0, 1, 0, 0)


class HelpContext(typer.Context):
    """A context whose help page is drawn with :data:`GUTTER`."""

    def get_help(self) -> str:
        from typer import rich_utils  # lazy on purpose: only a help page needs the renderer

        rich_utils.STYLE_OPTIONS_TABLE_PADDING = GUTTER
        return super().get_help()


def _plain_help(option) -> None:
    """A help option without a value placeholder, False when not given (see the docstring)."""
    if option is not None and getattr(option, "is_flag", False):
        option.metavar = ""
        option.default = False


def _no_placeholder(command, ctx) -> None:
    """Clear the value placeholder of `command`'s --help (and of its subcommands' --help), and
    draw their help pages with the gutter."""
    command.context_class = HelpContext
    _plain_help(command.get_help_option(ctx))
    for sub in getattr(command, "commands", {}).values():
        _no_placeholder(sub, ctx)


class HelpGroup(TyperGroup):
    """The `plan` group: its commands' --help options render without a value placeholder."""

    context_class = HelpContext

    def get_help_option(self, ctx: typer.Context):
        option = super().get_help_option(ctx)
        _plain_help(option)
        return option

    def get_command(self, ctx: typer.Context, cmd_name: str):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _no_placeholder(command, ctx)
        return command
