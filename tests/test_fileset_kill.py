"""An export killed at any rename or unlink of its swap (SIGKILL: no rollback runs) leaves, once
the next reader or writer has recovered, exactly the old complete set or exactly the new one,
byte for byte, with no leftovers; so does a recovery killed midway (planner/core/fileset.py,
core/swap_recovery.py, issue #31). The directory lock leaves no file behind."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planner.core import fileset

OLD = {"plan.json": "old plan\n", "launch.sh": "old launch\n", "megatron_args.sh": "old args\n"}
NEW = {"plan.json": "new plan\n", "launch.sh": "new launch\n", "ds_config.json": "{}\n"}
THIRD = {"plan.json": "third plan\n", "launch.sh": "third launch\n"}
MINE = {"notes.txt": "the user's own file\n"}  # never touched by any writer or recovery

# Runs one operation on a directory and SIGKILLs itself just before its N-th os.replace or
# os.unlink (the steps of a swap and of a recovery): nothing after that runs, no rollback.
KILLED = textwrap.dedent("""
    import json, os, signal, sys
    from planner.core import fileset
    out, kill_at, op = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    count = [0]
    def dying(real):
        def step(*args, **kwargs):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return step
    os.replace, os.unlink = dying(os.replace), dying(os.unlink)
    if op["do"] == "write":
        fileset.write_set(out, [fileset.OutFile(n, t, n.endswith(".sh"))
                                for n, t in op["files"].items()], force=True)
    else:
        assert fileset.verify_set(out) is None
""")


def _run(out: Path, kill_at: int, op: dict) -> int:
    done = subprocess.run([sys.executable, "-c", KILLED, str(out), str(kill_at), json.dumps(op)],
                          env={**os.environ, "PYTHONPATH": str(Path(fileset.__file__).parents[2])},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, -9), done.stderr
    return done.returncode


def _write(out: Path, texts: dict[str, str]) -> None:
    fileset.write_set(out, [fileset.OutFile(n, t, n.endswith(".sh")) for n, t in texts.items()],
                      force=True)


def _snapshot(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every entry of the directory, hidden ones too: its bytes and permission bits."""
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.lstat().st_mode)) for p in out.iterdir()}


def _start(tmp_path: Path, scenario: str) -> Path:
    out = tmp_path / "run"
    out.mkdir(parents=True)
    for name, text in MINE.items():
        (out / name).write_text(text)
    if scenario == "old set":
        _write(out, OLD)
    elif scenario == "user's plan.json":  # no set, but a hand-made file the export replaces
        (out / "plan.json").write_text("my own plan\n")
    return out


def _states(tmp_path: Path, scenario: str):
    """(directory, its snapshot before the export, the snapshot after an unkilled export)."""
    out = _start(tmp_path, scenario)
    clean = tmp_path / "clean"
    shutil.copytree(out, clean)
    assert _run(clean, 0, {"do": "write", "files": NEW}) == 0
    after = _snapshot(clean)
    shutil.rmtree(clean)
    return out, _snapshot(out), after


def _kill_at_every_step(out: Path, op: dict, each) -> int:
    """Kill ``op`` before its 1st, 2nd, ... step until it runs through; ``each(k)`` after every
    killed run, on the directory as restored before the next. The number of steps."""
    saved = out.with_name(out.name + "-saved")
    shutil.copytree(out, saved)
    kill_at = 1
    while _run(out, kill_at, op) == -9:
        each(kill_at)
        shutil.rmtree(out)
        shutil.copytree(saved, out)
        kill_at += 1
    shutil.rmtree(saved)
    return kill_at - 1


SCENARIOS = ["old set", "no set", "user's plan.json"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_reader_recovers_the_old_or_the_new_set_after_a_kill_at_any_step(tmp_path, scenario):
    out, before, after = _states(tmp_path, scenario)
    assert before != after
    seen = []

    def recovered(_kill_at):
        assert fileset.verify_set(out) is None  # recovers first, then checks the manifest
        now = _snapshot(out)
        assert now in (before, after), sorted(now)
        seen.append("new" if now == after else "old")
        if fileset.MANIFEST in now:
            assert fileset.read_set(out) == (NEW if now == after else OLD)

    steps = _kill_at_every_step(out, {"do": "write", "files": NEW}, recovered)
    # journal, old manifest and every replaced or dropped file aside, new files in, manifest
    # in, backups and journal out: at least two steps a file
    assert steps >= 2 * len(NEW) + 2, steps
    assert "old" in seen and "new" in seen  # killed before and after the commit point
    assert seen == sorted(seen, key=["old", "new"].index)  # one commit point: old, then new


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_next_writer_recovers_then_writes_a_complete_set(tmp_path, scenario):
    out, _, _ = _states(tmp_path, scenario)
    want = tmp_path / "want"
    shutil.copytree(out, want)
    _write(want, THIRD)
    expected = _snapshot(want)

    def next_writer(_kill_at):
        _write(out, THIRD)
        assert _snapshot(out) == expected  # no backup, temporary or journal left

    _kill_at_every_step(out, {"do": "write", "files": NEW}, next_writer)


def test_a_recovery_killed_midway_is_finished_by_the_next(tmp_path):
    out, before, after = _states(tmp_path, "old set")
    ends = set()

    def killed_recovery(_kill_at):
        killed = out.with_name("killed")
        shutil.copytree(out, killed)

        def finished(_):
            assert fileset.verify_set(killed) is None
            ends.add("new" if _snapshot(killed) == after else "old")
            assert _snapshot(killed) in (before, after)

        _kill_at_every_step(killed, {"do": "verify"}, finished)
        shutil.rmtree(killed)

    _kill_at_every_step(out, {"do": "write", "files": NEW}, killed_recovery)
    assert ends == {"old", "new"}


def test_plan_simulate_reads_the_recovered_plan_after_a_kill_at_any_step(tmp_path):
    """``plan simulate --plan DIR/plan.json`` recovers a killed export first, then replays the
    old plan or the new one, never a plan.json that its launch files do not belong to."""
    from typer.testing import CliRunner

    from cli import app

    def solve(out, *more):
        done = CliRunner().invoke(app, ["solve", "--gpus", "16", "--nodes", "2", "--launcher",
                                        "megatron", "--export", "json,megatron,torchrun",
                                        "--out", str(out), *more])
        assert done.exit_code == 0, done.output
        return fileset.read_set(out)

    out = tmp_path / "run"
    old, new = solve(out), solve(tmp_path / "new", "--micro-batch", "2")
    assert old["plan.json"] != new["plan.json"]
    digests = {json.loads(t["plan.json"])["plan_digest"]: t for t in (old, new)}

    def simulated(_kill_at):
        sim = CliRunner().invoke(app, ["simulate", "--plan", str(out / "plan.json"), "--json"])
        assert sim.exit_code == 0, sim.output
        found = fileset.read_set(out)
        assert found == digests[json.loads(found["plan.json"])["plan_digest"]]
        assert sorted(p.name for p in out.iterdir()) == sorted([*found, fileset.MANIFEST])

    _kill_at_every_step(out, {"do": "write", "files": new}, simulated)


def test_a_reader_that_cannot_write_reports_the_set_incomplete(tmp_path, monkeypatch):
    out = _start(tmp_path, "old set")
    # killed at its fourth step: journal in, old manifest aside, one old file aside
    assert _run(out, 4, {"do": "write", "files": NEW}) == -9

    def read_only(*args, **kwargs):  # a directory the reader may not write (root writes any)
        raise PermissionError(13, "Permission denied", str(args[0]))

    with monkeypatch.context() as m:
        m.setattr(fileset.os, "replace", read_only)
        m.setattr(fileset.os, "unlink", read_only)
        assert "incomplete" in fileset.verify_set(out)
        with pytest.raises(fileset.PlanInputError, match="incomplete.*--force"):
            fileset.read_set(out)
    assert fileset.read_set(out) == OLD  # once it can be written, the next reader recovers
    assert _snapshot(out) == _snapshot(_start(tmp_path / "again", "old set"))


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_non_file_at_an_output_name_is_refused_before_anything_is_written(tmp_path, kind):
    out = _start(tmp_path, "old set")
    (out / "launch.sh").unlink()
    os.mkdir(out / "launch.sh") if kind == "directory" else os.mkfifo(out / "launch.sh")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(fileset.OutputError, match="is in the way.*nothing was changed"):
        _write(out, NEW)
    assert sorted(p.name for p in out.iterdir()) == before
    assert fileset.verify_set(out) is not None  # its launch.sh is gone: not the set it lists


def test_no_lock_file_is_left_and_an_old_one_is_cleared(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / fileset.LOCK).symlink_to(tmp_path / "elsewhere")  # a planted link is not followed
    _write(out, NEW)
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([*NEW, fileset.MANIFEST])


def test_a_fifo_where_the_old_lock_was_does_not_block(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / fileset.LOCK)
    _write(out, NEW)
    assert fileset.read_set(out) == NEW
