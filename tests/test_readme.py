"""The outputs in the README and docs/ are generated, never typed: `python tools/readme_blocks.py
--write` reruns every ```text block that starts with a `$ plan ...` command (and `plan validate
--markdown` between the validation markers) and pastes what the code prints now. These tests fail
when a block is stale, so a number in the docs can never lie about the code beside it."""

import importlib.util
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_spec = importlib.util.spec_from_file_location("readme_blocks", ROOT / "tools" / "readme_blocks.py")
readme_blocks = sys.modules["readme_blocks"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_blocks)


def test_readme_validation_table_is_current():
    text = (ROOT / "docs" / "validation.md").read_text()
    block = text.split("<!-- validation:start -->\n", 1)[1].split("<!-- validation:end -->", 1)[0]
    summary, table = readme_blocks.validation_markdown().split("\n\n", 1)
    assert summary in block, ("docs/validation.md's summary is stale: rerun "
                              "`python tools/readme_blocks.py --write`")
    assert table.rstrip() in block, "docs/validation.md's validation table is stale"


def test_readme_output_blocks_are_current():
    assert len(readme_blocks.parse_blocks(README.read_text())) >= 5  # solve, explain, export, ...
    problems = [f"{page.name}: {p}" for page in readme_blocks.pages()
                for b in readme_blocks.parse_blocks(page.read_text())
                for p in readme_blocks.block_diffs(b, readme_blocks.run_block(b))]
    assert not problems, ("output blocks are stale; regenerate with "
                          "`python tools/readme_blocks.py --write`:\n" + "\n".join(problems))


def test_readme_links_every_docs_page():
    text = README.read_text()
    assert [p.name for p in readme_blocks.pages()[1:] if f"(docs/{p.name}" not in text] == []
    assert len(text.splitlines()) <= 400


SAMPLE = """intro
<!-- readme: columns=80 -->
```text
$ plan x --a \\
    --b
line 1
line 2
  ...
$ ls
f
```
```text
not a command block
```
"""


def test_blocks_parse_commands_continuations_widths_and_prefixes():
    (block,) = readme_blocks.parse_blocks(SAMPLE)
    assert block.columns == 80
    first, second = block.steps
    assert first.command == "plan x --a \\\n    --b"
    assert first.shown == ("line 1", "line 2") and first.truncated
    assert second.command == "ls" and second.shown == ("f",) and not second.truncated


def test_a_prefix_block_compares_only_its_shown_lines_and_timings_are_masked():
    (block,) = readme_blocks.parse_blocks(SAMPLE)
    assert not readme_blocks.block_diffs(block, [["line 1", "line 2", "more"], ["f"]])
    assert readme_blocks.block_diffs(block, [["line 1", "changed"], ["f"]])
    assert readme_blocks.block_diffs(block, [["line 1", "line 2"], ["f", "g"]])
    timed = readme_blocks.Block(0, 0, 80, (readme_blocks.Step("p", ("done in 0.47 s",), False),))
    assert not readme_blocks.block_diffs(timed, [["done in 1.02 s"]])
    assert readme_blocks.block_diffs(timed, [["done in 1.02 s, 3 plans"]])


def test_regenerated_block_keeps_its_prefix_marker():
    (block,) = readme_blocks.parse_blocks(SAMPLE)
    text = readme_blocks.render_block(block, [["new 1", "new 2", "new 3"], ["g"]])
    assert text == "$ plan x --a \\\n    --b\nnew 1\nnew 2\n  ...\n$ ls\ng\n"


def test_docs_settings_table_is_current():
    text = (ROOT / "docs" / "validation.md").read_text()
    block = text.split("<!-- settings:start -->\n", 1)[1].split("<!-- settings:end -->", 1)[0]
    assert block == readme_blocks.settings_markdown(), (
        "docs/validation.md's settings table is stale: rerun `python tools/readme_blocks.py --write`")
