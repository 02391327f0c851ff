"""An export killed at any rename of its swap (SIGKILL: no rollback runs) is never read as a
mix of two sets: a reader gets the complete old set, the complete new one, or "incomplete"; the
next export clears what the killed one left and writes a complete set (planner/core/fileset.py,
issue #31). The directory lock leaves no file behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from planner.core import fileset

OLD = {"plan.json": "old plan\n", "launch.sh": "old launch\n"}
NEW = {"plan.json": "new plan\n", "launch.sh": "new launch\n"}
# the renames of a two-file swap over an existing set: manifest out, each file's old copy out and
# its new one in, the new manifest in
RENAMES = 6

KILLED_WRITER = textwrap.dedent("""
    import os, sys
    from planner.core import fileset
    real, count = os.replace, [0]
    def dying(src, dst):
        count[0] += 1
        if count[0] == int(sys.argv[2]):
            os._exit(9)  # as SIGKILL: nothing after this runs, no rollback
        real(src, dst)
    os.replace = dying
    files = [fileset.OutFile(n, t) for n, t in {new}.items()]
    fileset.write_set(sys.argv[1], files, force=True)
""").format(new=NEW)


def _write(out, texts):
    fileset.write_set(out, [fileset.OutFile(n, t) for n, t in texts.items()], force=True)


@pytest.mark.parametrize("kill_at", range(1, RENAMES + 1))
def test_a_writer_killed_at_any_rename_is_never_read_as_a_mix(tmp_path, kill_at):
    out = tmp_path / "run"
    _write(out, OLD)
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(out), str(kill_at)])
    assert done.returncode == 9  # it did die inside the swap
    try:
        found = fileset.read_set(out)
    except fileset.PlanInputError as e:
        assert "incomplete" in str(e) and "--force" in str(e)
    else:
        assert found in (OLD, NEW)
    _write(out, NEW)  # the next export clears the leftovers
    assert fileset.read_set(out) == NEW
    assert sorted(p.name for p in out.iterdir()) == sorted([*NEW, fileset.MANIFEST])


def test_no_lock_file_is_left_and_an_old_one_is_cleared(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / fileset.LOCK).symlink_to(tmp_path / "elsewhere")  # a planted link is not followed
    _write(out, NEW)
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([*NEW, fileset.MANIFEST])


def test_a_fifo_where_the_old_lock_was_does_not_block(tmp_path):
    import os
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / fileset.LOCK)
    _write(out, NEW)
    assert fileset.read_set(out) == NEW
