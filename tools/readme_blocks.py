"""Regenerate the output blocks of the README and docs/*.md from the current code, or check that
they are current.

    python tools/readme_blocks.py            # check: list the blocks that differ (exit 1 if any)
    python tools/readme_blocks.py --write    # regenerate every block in place

An output block is a ```text fence whose first line is a shell command (``$ plan ...``; a line
ending in a backslash continues on the next). Every command of a block runs, in order, in one
fresh temporary directory (so ``--out run/`` then ``ls run/`` work), with the terminal width set by
an optional ``<!-- readme: columns=N -->`` line right above the fence (default 100), ``plan``
being this repository's CLI and ``python`` this interpreter (with the repository importable). A command's shown output that ends in a line ``...`` is a prefix: only
the lines above it are compared and regenerated. Two marked tables are generated too: between
``<!-- validation:start -->`` and ``<!-- validation:end -->``, ``plan validate --markdown``;
between ``<!-- model-fields:start -->`` and ``<!-- model-fields:end -->``, the model.json fields.

Timings vary from run to run, so ``in 0.47 s`` compares as ``in <t> s``; nothing else is masked.
tests/test_readme.py runs the check; the lead regenerates with ``--write`` after merges.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The files whose blocks are generated: the README, then docs/ by name."""
    return [README, *sorted(DOCS.glob("*.md"))]
DEFAULT_COLUMNS = 100
FENCE = re.compile(r"(?:<!-- readme: columns=(?P<columns>\d+) -->\n)?```text\n(?P<body>.*?)```",
                   re.S)
VOLATILE = re.compile(r"\bin \d+\.\d+ s\b")
ELLIPSIS = "..."


@dataclass(frozen=True)
class Step:
    """One shell command of a block and the output the README shows for it."""

    command: str  # as written, continuation lines included, without the "$ " prompt
    shown: tuple[str, ...]  # the README's lines (without a trailing "..." line)
    truncated: bool  # the README shows a prefix only


@dataclass(frozen=True)
class Block:
    start: int  # offsets of the fence body in the README text
    end: int
    columns: int
    steps: tuple[Step, ...]


def parse_blocks(text: str) -> list[Block]:
    """Every ```text block of ``text`` that starts with a ``$ `` command."""
    blocks = []
    for match in FENCE.finditer(text):
        body = match.group("body")
        if not body.startswith("$ "):
            continue
        steps, lines, i = [], body.splitlines(), 0
        while i < len(lines):
            command = [lines[i][2:]]
            while command[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                command.append(lines[i])
            i += 1
            shown = []
            while i < len(lines) and not lines[i].startswith("$ "):
                shown.append(lines[i])
                i += 1
            truncated = bool(shown) and shown[-1].strip() == ELLIPSIS
            steps.append(Step("\n".join(command), tuple(shown[:-1] if truncated else shown),
                              truncated))
        blocks.append(Block(match.start("body"), match.end("body"),
                            int(match.group("columns") or DEFAULT_COLUMNS), tuple(steps)))
    return blocks


def _env(columns: int, bindir: Path) -> dict:
    env = dict(os.environ, COLUMNS=str(columns), LINES="50", NO_COLOR="1", TERM="dumb",
               PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("FORCE_COLOR", None)
    return env


def _plan_shim(directory: Path) -> Path:
    """``plan`` (this checkout's CLI) and ``python`` (this interpreter) executables."""
    bindir = directory / "bin"
    bindir.mkdir()
    for name, line in (("plan", f'exec "{sys.executable}" -c "import cli; cli.app()" "$@"'),
                       ("python", f'exec "{sys.executable}" "$@"')):
        shim = bindir / name
        shim.write_text(f"#!/bin/sh\n{line}\n")
        shim.chmod(0o755)
    return bindir


def run_block(block: Block) -> list[list[str]]:
    """The output lines of each step, run now (stdout and stderr together, as a terminal shows)."""
    outputs = []
    with tempfile.TemporaryDirectory(prefix="readme-") as tmp:
        bindir = _plan_shim(Path(tmp))
        work = Path(tmp) / "work"
        work.mkdir()
        for step in block.steps:
            done = subprocess.run(["bash", "-c", step.command], cwd=work,
                                  env=_env(block.columns, bindir), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=300)
            outputs.append([line.rstrip() for line in done.stdout.splitlines()])
    return outputs


def _normal(lines) -> list[str]:
    return [VOLATILE.sub("in <t> s", line.rstrip()) for line in lines]


def block_diffs(block: Block, outputs: list[list[str]]) -> list[str]:
    """One message per step whose README output is not what the code prints now."""
    problems = []
    for step, got in zip(block.steps, outputs):
        want = _normal(step.shown)
        have = _normal(got[:len(want)] if step.truncated else got)
        if want != have:
            first = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b),
                         min(len(want), len(have)))
            problems.append(f"`{step.command.splitlines()[0]}` line {first + 1}: README has "
                            f"{want[first] if first < len(want) else '<end>'!r}, the code prints "
                            f"{have[first] if first < len(have) else '<end>'!r}")
    return problems


def render_block(block: Block, outputs: list[list[str]]) -> str:
    body = []
    for step, got in zip(block.steps, outputs):
        body.append("$ " + step.command)
        body.extend(got[:len(step.shown)] if step.truncated else got)
        if step.truncated:
            body.append("  " + ELLIPSIS)
    return "\n".join(body) + "\n"


def validation_markdown() -> str:
    from planner import api
    from planner.report.validation import validation_markdown as md

    checked = api.validate_runs()
    return md(checked.rows, checked.summary)


def settings_markdown() -> str:
    from planner import api
    from planner.report.validation import settings_markdown as md

    return md(api.single_source_settings())


def model_fields_markdown() -> str:
    from planner.model.template import fields_markdown

    return fields_markdown()


TABLES = {"validation": ("the validation table (plan validate --markdown)", validation_markdown),
          "settings": ("the single-source settings (plan validate --settings)", settings_markdown),
          "model-fields": ("the model.json field table", model_fields_markdown)}


def _table(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:start -->\n)(.*?)(<!-- {name}:end -->)", re.S)


def check(text: str) -> list[str]:
    """Every stale block of the README text, as messages (empty when all are current)."""
    problems = []
    for block in parse_blocks(text):
        problems += block_diffs(block, run_block(block))
    for name, (label, make) in TABLES.items():
        match = _table(name).search(text)
        if match and match.group(2) != make():
            problems.append(f"{label} is stale")
    return problems


def regenerate(text: str) -> str:
    """The README text with every output block replaced by what the code prints now."""
    for block in reversed(parse_blocks(text)):  # from the end: earlier offsets stay valid
        text = text[:block.start] + render_block(block, run_block(block)) + text[block.end:]
    for name, (_, make) in TABLES.items():
        text = _table(name).sub(lambda m: m.group(1) + make() + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate the blocks in place")
    args = parser.parse_args(argv)
    stale = 0
    for page in pages():
        text = page.read_text()
        name = page.relative_to(ROOT)
        if args.write:
            new = regenerate(text)
            tmp = page.with_suffix(".md.tmp")
            tmp.write_text(new)
            tmp.replace(page)
            print(f"{name}: {len(parse_blocks(new))} output blocks regenerated")
            continue
        for problem in check(text):
            print(f"{name}: {problem}")
            stale += 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
