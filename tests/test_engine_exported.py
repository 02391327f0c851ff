"""The engine harnesses read an export directory only as one complete set (planner/engine/
exported.py, issue #31 item 1): plan.json of one export beside the ds_config.json of another, a
file edited after the export, or a directory with no manifest is refused in one line, as the
exported launch.sh refuses it. Runs without torch: the harnesses themselves need an engine."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from planner.core.errors import PlanInputError
from planner.core.fileset import MANIFEST
from planner.engine.exported import plan_document, read_documents, read_export
from planner.launchers import export_plan
from test_export import ds_plan

ENGINE = Path(__file__).resolve().parent.parent / "planner" / "engine"


@pytest.fixture
def export(tmp_path) -> Path:
    out = tmp_path / "out"
    export_plan(ds_plan(), ["json", "deepspeed"], out)
    return out


def test_a_complete_set_is_read(export):
    files = read_documents(export, ("plan.json", "ds_config.json"))
    assert files["plan.json"] == json.loads((export / "plan.json").read_text())
    assert plan_document(export)["parallel"]["pp"] == 4


def test_a_file_edited_after_the_export_is_refused(export):
    config = json.loads((export / "ds_config.json").read_text())
    config["train_micro_batch_size_per_gpu"] += 1
    (export / "ds_config.json").write_text(json.dumps(config))
    with pytest.raises(PlanInputError, match=f"ds_config.json does not match {MANIFEST}"):
        read_documents(export, ("plan.json", "ds_config.json"))


def test_plan_json_of_another_export_is_refused(export, tmp_path):
    other = tmp_path / "other"
    export_plan(ds_plan(num_microbatches=32), ["json", "deepspeed"], other)
    (export / "plan.json").write_bytes((other / "plan.json").read_bytes())
    with pytest.raises(PlanInputError, match=f"plan.json does not match {MANIFEST}"):
        plan_document(export)


def test_a_directory_without_its_manifest_is_refused(export):
    (export / MANIFEST).unlink()
    with pytest.raises(PlanInputError, match=f"holds no plan3d export set \\({MANIFEST} missing"):
        plan_document(export)


def test_a_set_without_the_file_asked_for_is_refused(tmp_path):
    out = tmp_path / "json-only"
    export_plan(ds_plan(), ["json"], out)
    with pytest.raises(PlanInputError, match="holds no ds_config.json; export the plan"):
        read_export(out, ("plan.json", "ds_config.json"))


def _reads_files(path: Path) -> list[str]:
    """Where a module reads a file itself: read_text/read_bytes/open calls."""
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Attribute)
                 and node.func.attr in ("read_text", "read_bytes"))
                or (isinstance(node.func, ast.Name) and node.func.id == "open"))]


def test_no_harness_reads_an_export_file_but_through_the_verified_set():
    harnesses = sorted(ENGINE.glob("*_run.py"))
    assert {p.name for p in harnesses} >= {"deepspeed_run.py", "torch_run.py",
                                           "torchtitan_run.py"}
    for path in harnesses:
        assert _reads_files(path) == [], "read an export file past plan3d-manifest.json"
    sources = {p.name: p.read_text() for p in harnesses}
    assert "read_documents(directory, (PLAN, \"ds_config.json\"))" in sources["deepspeed_run.py"]
    assert "read_export(d, (PLAN, \"torchtitan.toml\"))" in sources["torchtitan_run.py"]
