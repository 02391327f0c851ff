"""Hostile and careless input (issue #12): every case ends with exit 1 or 2, one clear line on
stderr (or JSON on stdout with --json), no traceback, in bounded time; nothing injected runs; no
mixed export set appears under concurrent writers.

The CLI runs in-process (typer's CliRunner) under an alarm: a case that hangs fails by timeout
instead of blocking the suite.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()
CASE_SECONDS = 60  # generous for a 2-core CI box; a hang would take hours


class Hang(Exception):
    pass


@contextmanager
def deadline(seconds: int):
    def alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def invoke(args: list[str], cwd: Path | None = None):
    with deadline(CASE_SECONDS):
        if cwd is None:
            return runner.invoke(app, [str(a) for a in args])
        old = os.getcwd()
        os.chdir(cwd)
        try:
            return runner.invoke(app, [str(a) for a in args])
        finally:
            os.chdir(old)


def assert_clean_failure(result, codes=(1, 2), as_json: bool = False) -> str:
    """Exit 1 or 2, no traceback, one line on stderr (or a JSON error document on stdout)."""
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"raised {exc!r}"
    assert result.exit_code in codes, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    if as_json:
        doc = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
        assert doc["plans"] == [] and doc["error"]["message"]
        assert doc["error"]["exit_code"] == result.exit_code
        return doc["error"]["message"]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "\x1b" not in result.stderr
    return lines[0]


# --- inputs ---------------------------------------------------------------------------------------

TINY = {"name": "tiny", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
        "vocab_size": 256, "seq_length": 64}
HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
      "max_position_embeddings": 64}
HW = {"name": "gpu", "peak_tflops": 100, "memory_gib": 80, "memory_bandwidth_gbps": 2000,
      "intra_node_gbps": 300, "inter_node_gbps": 25, "gpus_per_node": 8}

HOSTILE_NAMES = {
    "newline": "x\n$(touch SENTINEL)",
    "carriage-return": "x\r$(touch SENTINEL)",
    "command-substitution": "$(touch SENTINEL)",
    "backticks": "`touch SENTINEL`",
    "quotes": "x'; touch SENTINEL; echo '\"",
    "nul": "x\x00y",
    "line-separator": "x\u2028touch SENTINEL",
    "ansi": "\x1b[31mred\x1b[0m",
    "toml-table": "x\n[checkpoint]\nfolder = \"/tmp/evil\"",
    "too-long": "m" * 10_000,
    "empty": "",
}
# names no loader accepts (control or invisible characters, absurd length, empty); the printable
# ones above ($(), backticks, quotes) are legal names and are made harmless by the exporters' quoting
REFUSED_NAMES = [k for k in HOSTILE_NAMES
                 if k not in ("command-substitution", "backticks", "quotes")]
MARKUP_NAMES = {"rich-close": "[/bold]x", "rich-open": "[bold red]loud", "link": "[link=x]y"}


def write(tmp_path: Path, name: str, doc, raw: bool = False) -> Path:
    path = tmp_path / name
    path.write_text(doc if raw else json.dumps(doc))
    return path


def solve(*extra):
    return ["solve", "--gpus", "8", "--nodes", "1", "--refine", "2", "--top", "2", *extra]


# --- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("label", REFUSED_NAMES)
@pytest.mark.parametrize("where", ["model.json", "hf-config", "hardware"])
def test_hostile_names_are_refused_at_load(tmp_path, label, where):
    name = HOSTILE_NAMES[label]
    if where == "model.json":
        args = solve("--model", write(tmp_path, "m.json", {**TINY, "name": name}))
    elif where == "hf-config":
        args = solve("--model", write(tmp_path, "config.json", {**HF, "_name_or_path": name}))
    else:
        args = solve("--hardware", write(tmp_path, "hw.json", {**HW, "name": name}))
    line = assert_clean_failure(invoke(args), codes=(2,))
    assert "name" in line


@pytest.mark.parametrize("label", MARKUP_NAMES)
def test_rich_markup_in_a_name_is_printed_not_interpreted(tmp_path, label):
    name = MARKUP_NAMES[label]
    model = write(tmp_path, "m.json", {**TINY, "name": name})
    result = invoke(solve("--model", model, "--csv", tmp_path / "plans.csv"))
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert name in result.stdout


def test_a_markup_name_in_an_error_is_printed_as_text(tmp_path):
    result = invoke(solve("--model", "[/bold]x"))
    assert "[/bold]x" in assert_clean_failure(result, codes=(2,))


# --- model files --------------------------------------------------------------------------------

MODEL_CASES = {
    "layers-as-word": {"num_layers": "eight"},
    "layers-as-float": {"num_layers": 8.0},
    "layers-1e30": {"num_layers": 1e30},
    "layers-negative": {"num_layers": -3},
    "layers-zero": {"num_layers": 0},
    "layers-bool": {"num_layers": True},
    "layers-100k": {"num_layers": 100_000},
    "hidden-null": {"hidden_size": None},
    "hidden-huge": {"hidden_size": 2**62},
    "heads-zero": {"num_attention_heads": 0},
    "misspelled-kv": {"num_kv_head": 4},
    "unknown-key": {"colour": "red"},
    "mlp-unknown": {"mlp": "relu"},
    "norm-typo": {"norm": "rmsnrom"},
    "bias-string": {"bias": "yes"},
    "seq-float": {"seq_length": 64.5},
    "vocab-list": {"vocab_size": [256]},
    "layers-not-list": {"layers": "block"},
    "layers-empty": {"layers": []},
    "layers-100k-repeat": {"layers": [{"kind": "embedding"}, {"kind": "block",
                                                                 "repeat": 100_000}]},
    "layer-unknown-kind": {"layers": [{"kind": "conv"}]},
    "layer-typo": {"layers": [{"kind": "block", "repeats": 2}]},
    "layer-zero-heads": {"layers": [{"kind": "block", "num_attention_heads": 0}]},
    "layer-not-object": {"layers": [3]},
    "rope-scaling-string": {"rope_scaling": "llama3"},
    "rope-scaling-list": {"rope_scaling": [8.0]},
    "rope-factor-string": {"rope_scaling": {"rope_type": "llama3", "factor": "eight"}},
    "rope-llama3-no-factor": {"rope_scaling": {"rope_type": "llama3"}},
}


@pytest.mark.parametrize("label", MODEL_CASES)
def test_bad_model_files(tmp_path, label):
    doc = {**TINY, **MODEL_CASES[label]}
    if "layers" in MODEL_CASES[label]:
        doc.pop("num_layers")
    line = assert_clean_failure(invoke(solve("--model", write(tmp_path, "m.json", doc))),
                                codes=(2,))
    assert "m.json" in line


def test_misspelled_key_gets_a_suggestion(tmp_path):
    doc = {**TINY, "num_kv_head": 4}
    line = assert_clean_failure(invoke(solve("--model", write(tmp_path, "m.json", doc))))
    assert "did you mean 'num_kv_heads'" in line


RAW_JSON = {
    "nan": '{"name": "x", "num_layers": NaN}',
    "infinity": '{"num_layers": Infinity}',
    "overflow-float": '{"num_layers": 1e400}',
    "huge-int": '{"num_layers": ' + "9" * 5000 + "}",
    "deep-100k": "[" * 100_000 + "]" * 100_000,
    "deep-40": "[" * 40 + "]" * 40,
    "empty": "",
    "whitespace": "   \n",
    "truncated": '{"num_layers": 4',
    "list": "[1, 2]",
    "string": '"llama"',
    "not-utf8": "\udcff",
}


@pytest.mark.parametrize("label", RAW_JSON)
@pytest.mark.parametrize("flag", ["--model", "--hardware", "--profile"])
def test_malformed_json_files(tmp_path, label, flag):
    path = tmp_path / "in.json"
    if label == "not-utf8":
        path.write_bytes(b"{\"name\": \"\xff\xfe\"}")
    else:
        path.write_text(RAW_JSON[label])
    assert_clean_failure(invoke(solve(flag, path)), codes=(2,))


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "dev-zero":
        return Path("/dev/zero")
    if kind == "fifo":
        path = tmp_path / "fifo.json"
        os.mkfifo(path)
        return path
    if kind == "directory":
        return tmp_path
    if kind == "too-big":
        path = tmp_path / "big.json"
        with open(path, "wb") as f:
            f.truncate(17 * 2**20)  # sparse: 17 MiB of zeros, no disk used
        return path
    if kind == "missing":
        return tmp_path / "nope.json"
    if kind == "unreadable":
        path = tmp_path / "secret.json"
        path.write_text("{}")
        path.chmod(0)
        return path
    raise AssertionError(kind)


SPECIAL = ["dev-zero", "fifo", "directory", "too-big", "missing", "unreadable"]


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("command", ["model", "hardware", "profile", "validate", "plan", "stack"])
def test_special_files_are_refused_quickly(tmp_path, kind, command):
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = _special(tmp_path, kind)
    args = {"model": solve("--model", path), "hardware": solve("--hardware", path),
            "profile": solve("--profile", path), "validate": ["validate", path],
            "plan": ["simulate", "--plan", path], "stack": solve("--stack", path)}[command]
    assert_clean_failure(invoke(args), codes=(2,))


# --- hardware, profile, runs, plan files ---------------------------------------------------------

HARDWARE_CASES = {
    "peak-nan": '{"peak_tflops": NaN}',
    "peak-zero": {"peak_tflops": 0},
    "peak-string": {"peak_tflops": "312"},
    "efficiency-5": {"matmul_efficiency": 5.0},
    "efficiency-zero": {"attention_efficiency": 0},
    "bandwidth-negative": {"inter_node_gbps": -25},
    "gpus-per-node-fraction": {"gpus_per_node": 8.5},
    "sm-count-bool": {"sm_count": True},
    "misspelled": {"peak_tflop": 312},
    "missing-name": {"name": None},
}


@pytest.mark.parametrize("label", HARDWARE_CASES)
def test_bad_hardware_files(tmp_path, label):
    case = HARDWARE_CASES[label]
    if isinstance(case, str):
        text = json.dumps(HW)[:-1] + ", " + case[1:]
    else:
        doc = {**HW, **case}
        if case.get("name", "") is None:
            doc.pop("name")
        text = json.dumps(doc)
    path = write(tmp_path, "hw.json", text, raw=True)
    line = assert_clean_failure(invoke(solve("--hardware", path)), codes=(2,))
    assert "hw.json" in line


def _stack_doc() -> dict:
    bundled = Path(__file__).resolve().parent.parent / "profiles" / "stacks"
    return json.loads((bundled / "megatron-core.json").read_text())


STACK_CASES = {
    "name-newline": {"name": "core\n$(touch x)"},
    "version-ansi": {"version": "\x1b[31m2025"},
    "misspelled": {"flash_attenton": True},
    "overhead-nan": '"pipeline_action_overhead_s": NaN',
    "overhead-huge": {"pipeline_action_overhead_s": 1e9},
}


@pytest.mark.parametrize("label", STACK_CASES)
def test_bad_stack_files(tmp_path, label):
    case = STACK_CASES[label]
    if isinstance(case, str):
        text = json.dumps(_stack_doc())[:-1] + ", " + case + "}"
    else:
        text = json.dumps({**_stack_doc(), **case})
    path = write(tmp_path, "stack.json", text, raw=True)
    assert "stack.json" in assert_clean_failure(invoke(solve("--stack", path)), codes=(2,))


def _profile_doc() -> dict:
    timing = {"kind": "block", "fwd_s": 0.001, "bwd_input_s": 0.001, "bwd_weight_s": 0.001,
              "fwd_flops": 1e9, "bwd_input_flops": 1e9, "bwd_weight_flops": 1e9}
    return {"schema": "plan3d/profile/v1", "model_name": "tiny", "device": "cpu",
            "device_name": "cpu", "dtype": "float32", "tp": 1, "micro_batch": 1, "seq_len": 64,
            "timings": [timing], "layer_timing": [0] * 6, "environment": {}}


PROFILE_CASES = {
    "unknown-key": {"colour": 1},
    "tp-zero": {"tp": 0},
    "seq-float": {"seq_len": 64.0},
    "device-typo": {"device": "gpuu"},
    "ansi-device-name": {"device_name": "\x1b[2Jcleared"},
    "timings-not-list": {"timings": {}},
    "index-out-of-range": {"layer_timing": [7]},
    "layer-timing-huge": {"layer_timing": [0] * 100_000},
}


@pytest.mark.parametrize("label", PROFILE_CASES)
def test_bad_profile_files(tmp_path, label):
    path = write(tmp_path, "prof.json", {**_profile_doc(), **PROFILE_CASES[label]})
    assert_clean_failure(invoke(solve("--profile", path)), codes=(2,))


def _run_case() -> dict:
    bundled = Path(__file__).resolve().parent.parent / "profiles" / "validation"
    return json.loads((bundled / "published_runs.json").read_text())[0]


RUNS_CASES = {
    "empty-list": [],
    "object-not-list": {"runs": []},
    "misspelled-case-key": [{**_run_case(), "mesured": {}}],
    "step-time-zero": [{**_run_case(), "measured": {**_run_case()["measured"],
                                                    "step_time_s": 0}}],
    "tp-string": [{**_run_case(), "config": {**_run_case()["config"], "tp": "8"}}],
    "name-with-ansi": [{**_run_case(), "name": "\x1b]0;title\x07run"}],
    "missing-model": [{k: v for k, v in _run_case().items() if k != "model"}],
}


@pytest.mark.parametrize("label", RUNS_CASES)
def test_bad_runs_files(tmp_path, label):
    path = write(tmp_path, "runs.json", RUNS_CASES[label])
    assert_clean_failure(invoke(["validate", path]), codes=(2,))


def test_validate_on_an_empty_file_says_so(tmp_path):
    path = write(tmp_path, "runs.json", "", raw=True)
    assert "empty" in assert_clean_failure(invoke(["validate", path]), codes=(2,))


def _plan_doc(**parallel) -> dict:
    stage = {"stage": 0, "rank": 0, "layers": [0, 6], "fwd_s": 0.1, "bwd_s": 0.2,
             "wgrad_s": 0.1, "send_s": 0.0}
    par = {"tp": 1, "pp": 1, "dp": 1, "num_microbatches": 4, "schedule": "1f1b",
           "virtual_stages": 1, **parallel}
    return {"schema": "plan3d/plan/v1", "parallel": par, "stages": [stage]}


PLAN_CASES = {
    "fwd-negative": {**_plan_doc(), "stages": [{**_plan_doc()["stages"][0], "fwd_s": -1}]},
    "fwd-string": {**_plan_doc(), "stages": [{**_plan_doc()["stages"][0], "fwd_s": "fast"}]},
    "microbatches-10-7": _plan_doc(num_microbatches=10**7),
    "schedule-unknown": _plan_doc(schedule="zigzag"),
    "stages-mismatch": _plan_doc(pp=2),
    "no-plans": {"plans": [], "rejected": {}},
    "not-a-plan": {"hello": "world"},
    "stages-missing": {k: v for k, v in _plan_doc().items() if k != "stages"},
}


@pytest.mark.parametrize("label", PLAN_CASES)
def test_bad_plan_files(tmp_path, label):
    path = write(tmp_path, "plan.json", PLAN_CASES[label])
    assert_clean_failure(invoke(["simulate", "--plan", path]), codes=(2,))


# --- flags and bounded work ---------------------------------------------------------------------

FLAG_CASES = {
    "gpus-10-12": ["solve", "--gpus", 10**12, "--nodes", 1],
    "gpus-zero": ["solve", "--gpus", 0, "--nodes", 1],
    "nodes-zero": ["solve", "--gpus", 8, "--nodes", 0],
    "nodes-over-gpus": ["solve", "--gpus", 8, "--nodes", 16],
    "global-batch-10-15": solve("--global-batch", 10**15),
    "global-batch-prime": ["solve", "--gpus", 16, "--nodes", 2, "--global-batch", 1000003,
                           "--refine", 2],
    "batch-range-words": solve("--global-batch-range", "a,b"),
    "batch-range-reversed": solve("--global-batch-range", "64,8"),
    "max-bubble-nan": solve("--max-bubble", "nan"),
    "max-bubble-inf": solve("--max-bubble", "inf"),
    "export-comma": solve("--export", ",", "--out", "OUT"),
    "export-unknown": solve("--export", "slurm", "--out", "OUT"),
    "export-without-out": solve("--export", "json"),
    "gpu-and-hardware": solve("--gpu", "h100", "--hardware", "HW"),
    "virtual-without-schedule": solve("--virtual-stages", 2, "--pp", 2),
    "tp-zero": solve("--tp", 0),
    "seq-len-zero": solve("--seq-len", 0),
    "seq-len-huge": solve("--seq-len", 10**12),
    "schedule-typo": solve("--schedule", "1fb1"),
    "simulate-comm-nan": ["simulate", "--pp", 2, "--microbatches", 4, "--comm-time", "nan"],
    "simulate-comm-inf": ["simulate", "--pp", 2, "--microbatches", 4, "--comm-time", "inf"],
    "simulate-stage-nan": ["simulate", "--pp", 2, "--microbatches", 4, "--stage-times", "nan,1"],
    "simulate-stage-inf": ["simulate", "--pp", 2, "--microbatches", 4, "--stage-times", "1,inf"],
    "simulate-microbatches-10-7": ["simulate", "--pp", 2, "--microbatches", 10**7],
    "simulate-pp-10-6": ["simulate", "--pp", 10**6, "--microbatches", 4],
    "simulate-virtual-10-6": ["simulate", "--pp", 2, "--microbatches", 4, "--schedule",
                              "interleaved", "--virtual-stages", 10**6],
    "layout-huge": ["layout", "--tp", 8, "--pp", 10**6, "--dp", 10**6],
    "partition-pp-huge": ["partition", "--pp", 10**6],
    "partition-microbatches-huge": ["partition", "--pp", 2, "--microbatches", 10**9],
    "profile-budget-nan": ["profile", "tiny-not-a-model", "--budget-s", "nan"],
}


@pytest.mark.parametrize("label", FLAG_CASES)
def test_bad_flags_and_absurd_sizes(tmp_path, label):
    args = [str(a) for a in FLAG_CASES[label]]
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    if "HW" in args:
        args[args.index("HW")] = str(write(tmp_path, "hw.json", HW))
    assert_clean_failure(invoke(args))


def test_global_batch_10_15_is_bounded_and_says_why():
    line = assert_clean_failure(invoke(solve("--global-batch", 10**15)))
    assert "microbatches" in line


# --- output errors --------------------------------------------------------------------------------

def test_out_that_is_a_file(tmp_path):
    target = tmp_path / "out"
    target.write_text("mine")
    result = invoke(solve("--export", "json", "--out", target))
    assert_clean_failure(result, codes=(2,))
    assert target.read_text() == "mine"


def test_csv_that_is_a_directory(tmp_path):
    assert_clean_failure(invoke(solve("--csv", tmp_path)), codes=(2,))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
@pytest.mark.parametrize("what", ["export", "csv", "svg", "profile", "lp"])
def test_read_only_directory(tmp_path, what):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    args = {"export": solve("--export", "json,megatron", "--out", ro / "run"),
            "csv": solve("--csv", ro / "p.csv"),
            "svg": ["simulate", "--pp", 2, "--microbatches", 4, "--svg", ro / "s.svg"],
            "profile": ["profile", "--calibrate", "--out", ro / "hw.json"],
            "lp": ["partition", "--pp", 2, "--model", write(tmp_path, "m.json", TINY),
                   "--lp", ro / "m.lp"]}[what]
    if what == "profile":
        pytest.skip("calibration runs for seconds; the same write path is covered by csv/svg")
    line = assert_clean_failure(invoke(args), codes=(2,))
    assert "Permission denied" in line or "Read-only" in line


UNDER_A_FILE = {
    "export": lambda f: solve("--export", "json", "--out", f / "run"),
    "csv": lambda f: solve("--csv", f / "p.csv"),
    "svg": lambda f: ["simulate", "--pp", 2, "--microbatches", 4, "--svg", f / "s.svg"],
    "lp": lambda f: ["partition", "--pp", 2, "--model", "llama2-7b", "--lp", f / "m.lp"],
    "calibrate-out": lambda f: ["profile", "--calibrate", "--out", f / "hw.json", "--device",
                                "tpu"],
}


@pytest.mark.parametrize("what", UNDER_A_FILE)
def test_output_under_a_file(tmp_path, what):
    """A path whose parent is a regular file: an OSError for every user, root included."""
    blocker = tmp_path / "blocker"
    blocker.write_text("mine")
    line = assert_clean_failure(invoke(UNDER_A_FILE[what](blocker)), codes=(2,))
    assert what == "calibrate-out" or "Not a directory" in line or "File exists" in line
    assert blocker.read_text() == "mine"


def test_partition_lp_respects_force(tmp_path):
    lp = tmp_path / "m.lp"
    lp.write_text("mine")
    result = invoke(["partition", "--pp", 2, "--model", write(tmp_path, "m.json", TINY),
                     "--lp", lp])
    assert "--force" in assert_clean_failure(result, codes=(2,))
    assert lp.read_text() == "mine"


def test_disk_full_rolls_back_the_whole_set(tmp_path, monkeypatch):
    """The third file's write fails with ENOSPC: the directory keeps the old set, untouched."""
    from planner.core import fileset

    out = tmp_path / "run"
    first = invoke(solve("--export", "json,megatron,torchrun", "--out", out, "--launcher",
                         "megatron"))
    assert first.exit_code == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = fileset._write_temp
    calls = []

    def failing(out_dir, f):
        calls.append(f.name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(out_dir / f.name))
        return real(out_dir, f)

    monkeypatch.setattr(fileset, "_write_temp", failing)
    result = invoke(solve("--export", "json,megatron,torchrun", "--out", out, "--force",
                          "--launcher", "megatron", "--micro-batch", 2))
    assert "No space left on device" in assert_clean_failure(result, codes=(2,))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_failure_while_swapping_restores_the_old_set(tmp_path, monkeypatch):
    from planner.core import fileset

    out = tmp_path / "run"
    fileset.write_set(out, [fileset.OutFile("a.txt", "old a"), fileset.OutFile("b.txt", "old b")])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = os.replace
    calls = []

    def failing(src, dst):
        calls.append(dst)
        if str(src).endswith(".tmp") and str(dst).endswith("b.txt"):  # the new b moving in
            raise OSError(5, "Input/output error", str(dst))
        return real(src, dst)

    monkeypatch.setattr(fileset.os, "replace", failing)
    with pytest.raises(fileset.OutputError, match="Input/output error"):
        fileset.write_set(out, [fileset.OutFile("a.txt", "new a"),
                                fileset.OutFile("b.txt", "new b")], force=True)
    monkeypatch.setattr(fileset.os, "replace", real)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert fileset.verify_set(out) is None


def test_a_killed_export_is_reported_not_read(tmp_path):
    from planner.core import fileset

    out = tmp_path / "run"
    fileset.write_set(out, [fileset.OutFile("plan.json", "{}")])
    # what a writer of an earlier release killed between its renames left: no manifest, and an
    # empty marker with no journal to recover from (a journaled one: tests/test_fileset_kill.py)
    (out / fileset.MANIFEST).unlink()
    (out / fileset.SWAPPING).touch()
    with pytest.raises(Exception, match="incomplete"):
        fileset.read_set(out)
    fileset.write_set(out, [fileset.OutFile("plan.json", "{}")], force=True)  # clears it
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", fileset.MANIFEST]


# --- --json ---------------------------------------------------------------------------------------

JSON_CASES = {
    "bad-model": solve("--model", "no-such-model", "--json"),
    "bad-flag-value": solve("--tp", 3, "--json"),
    "infeasible": ["solve", "--gpus", 8, "--nodes", 1, "--model", "llama3-405b", "--json",
                   "--refine", 2],
    "pins-contradict": solve("--tp", 2, "--pp", 2, "--dp", 4, "--json"),
    "bad-export": solve("--export", ",", "--out", "OUT", "--json"),
    "simulate": ["simulate", "--pp", 2, "--microbatches", 0, "--json"],
    "partition": ["partition", "--pp", 0, "--json"],
}


@pytest.mark.parametrize("label", JSON_CASES)
def test_json_always_prints_json(tmp_path, label):
    args = [str(tmp_path / "out") if a == "OUT" else str(a) for a in JSON_CASES[label]]
    result = invoke(args)
    assert_clean_failure(result, as_json=True)
    doc = json.loads(result.stdout)
    assert set(doc) >= {"plans", "error", "rejected"}
    if label == "infeasible":
        assert result.exit_code == 1 and doc["rejected"]


def test_json_never_holds_nan(tmp_path):
    result = invoke(solve("--json"))
    assert result.exit_code == 0
    json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


# --- injection: every export sourced, executed or parsed ------------------------------------------

def _plan(name: str, gpu_name: str = "a100-80gb", launcher: str = "megatron"):
    from dataclasses import replace

    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.presets import PRESETS
    from planner.search.request import Pins, Request
    from planner.search.solver import search
    from planner.stack import load_stack

    # Hardware and ModelSpec refuse such a name in their constructors (the first defence); set
    # past them, to test the second: every exporter writes a name as data
    spec = replace(PRESETS["llama3-8b"])
    object.__setattr__(spec, "name", name)
    cluster = make_cluster(load_hardware("a100-80gb"), 16, 2)
    object.__setattr__(cluster.hardware, "name", gpu_name)
    # FSDP2 has no ZeRO-1 (torchtitan's exporter refuses it): torchtitan plans shard at ZeRO-2
    # DeepSpeed runs no TP (its exporter refuses tp > 1): its plans are pp2 x dp8
    tp = 1 if launcher == "deepspeed" else 2
    pins = Pins(tp=tp, pp=2, dp=8 // tp, micro_batch=1, schedule="1f1b", recompute="full",
                zero=2 if launcher == "torchtitan" else 1, sequence_parallel=tp > 1)
    req = Request(model=spec, cluster=cluster, pins=pins, refine=1, top=1,
                  launcher=launcher, options=load_stack(None, launcher))
    return search(req).plans[0]


# a plan is priced on one launcher's stack and exported for that launcher (plus json, torchrun);
# torchtitan: the 0.2.2 TOML
LAUNCHER_TARGETS = {"megatron": ["json", "megatron", "torchrun"], "deepspeed": ["deepspeed"],
                    "torchtitan": ["torchtitan"]}
TORCHTITAN_VERSIONS = ("0.2.2",)


def _exports(launcher: str):
    """(torchtitan version, out-dir suffix) for each export of ``launcher``'s plan."""
    if launcher != "torchtitan":
        return [(TORCHTITAN_VERSIONS[0], launcher)]
    return [(v, f"{launcher}-{v}") for v in TORCHTITAN_VERSIONS]
INJECTIONS = {**{k: v for k, v in HOSTILE_NAMES.items() if k not in ("too-long", "empty")},
              **MARKUP_NAMES,
              "python-docstring": 'x\n"""\nimport os; os.system("touch SENTINEL")\n"""',
              "dollar-brace": "${IFS}$(touch SENTINEL)"}


@pytest.fixture(scope="module")
def benign_export(tmp_path_factory):
    from planner.launchers import render_all

    files = {}
    for launcher, targets in LAUNCHER_TARGETS.items():
        for version, _ in _exports(launcher):
            files.update(render_all(_plan("benign", launcher=launcher), targets))
    return files


def _stub_bin(tmp_path: Path) -> Path:
    """torchrun, srun and scontrol that do nothing: the scripts run to their end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("torchrun", "srun", "scontrol"):
        script = bin_dir / tool
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("label", INJECTIONS)
def test_names_in_exports_are_data_never_code(tmp_path, label, benign_export):
    import ast
    import subprocess
    import tomllib

    from planner.core.fileset import MANIFEST
    from planner.launchers import export_plan
    from planner.launchers.megatron import parse_megatron_args

    sentinel = tmp_path / "SENTINEL"
    name = INJECTIONS[label].replace("SENTINEL", str(sentinel))
    out, titan_dir = tmp_path / "run", tmp_path / "run-torchtitan"
    for launcher, targets in LAUNCHER_TARGETS.items():
        plan = _plan(name, name, launcher)
        for version, where in _exports(launcher):
            for path in export_plan(plan, targets, tmp_path / where):
                # one place to read every file from; torchtitan's apart, as launch.sh runs
                # one framework
                place = titan_dir if launcher == "torchtitan" else out
                place.mkdir(exist_ok=True)
                (place / path.name).symlink_to(path)
            if launcher == "megatron":  # launch.sh's set: it checks the files its manifest lists
                (out / MANIFEST).symlink_to(tmp_path / where / MANIFEST)
    env = {**os.environ, "PATH": f"{_stub_bin(tmp_path)}:{os.environ['PATH']}",
           "MASTER_ADDR": "127.0.0.1", "SLURM_JOB_NODELIST": "n1", "SLURM_SUBMIT_DIR": str(out),
           "SLURM_NODEID": "0"}
    # bash: source the arguments, run the launcher and the batch script
    probe = subprocess.run(["bash", "-c", 'source "$1" && printf "%s\\n" "${MEGATRON_ARGS[@]}"',
                            "_", out / "megatron_args.sh"], env=env, capture_output=True,
                           text=True, timeout=30, cwd=tmp_path)
    assert not sentinel.exists(), f"{label}: sourcing megatron_args.sh ran injected code"
    assert probe.returncode == 0, probe.stderr
    for script in ("launch.sh", "job.sbatch"):
        done = subprocess.run(["bash", out / script], env=env, capture_output=True, text=True,
                              timeout=30, cwd=tmp_path)
        assert not sentinel.exists(), f"{label}: running {script} ran injected code"
        assert done.returncode == 0, (script, done.stderr)
    # Python: compiled and executed with a stand-in deepspeed.pipe
    source = (out / "deepspeed_pipeline.py").read_text()
    tree = ast.parse(source)
    defined = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets}
    assert defined == {"PARTS", "NUM_STAGES", "ACTIVATION_CHECKPOINT_INTERVAL", "BLOCK_TYPE",
                       "CHECKPOINTABLE_LAYERS"}
    stub = type(sys)("deepspeed.pipe")
    stub.PipelineModule = type("PipelineModule", (), {})
    saved = {k: sys.modules.get(k) for k in ("deepspeed", "deepspeed.pipe")}
    sys.modules["deepspeed"], sys.modules["deepspeed.pipe"] = type(sys)("deepspeed"), stub
    try:
        namespace: dict = {}
        exec(compile(source, "deepspeed_pipeline.py", "exec"), namespace)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    assert not sentinel.exists(), f"{label}: an export ran injected code"
    # what each file says equals what the same plan says under a benign name
    want_args = parse_megatron_args(benign_export["megatron_args.sh"])
    assert parse_megatron_args((out / "megatron_args.sh").read_text()) == want_args
    assert probe.stdout.splitlines() == [
        line for line in subprocess.run(
            ["bash", "-c", 'eval "$1"; printf "%s\\n" "${MEGATRON_ARGS[@]}"', "_",
             benign_export["megatron_args.sh"]], capture_output=True, text=True).stdout
        .splitlines()]
    assert tomllib.loads((titan_dir / "torchtitan.toml").read_text()) == \
        tomllib.loads(benign_export["torchtitan.toml"])
    assert json.loads((out / "ds_config.json").read_text()) == \
        json.loads(benign_export["ds_config.json"])
    assert json.loads((out / "plan.json").read_text())["model"]["name"] == name
    assert namespace["PARTS"] == ast.literal_eval(
        next(line for line in benign_export["deepspeed_pipeline.py"].splitlines()
             if line.startswith("PARTS =")).split("=", 1)[1])
    for text in [out / f for f in ("megatron_args.sh", "launch.sh", "job.sbatch",
                                   "deepspeed_pipeline.py")] + \
            [titan_dir / "torchtitan.toml"]:
        for line in text.read_text().splitlines():
            assert line.isprintable() or "\t" in line, repr(line)


# --- concurrency ----------------------------------------------------------------------------------

def _writer(args):
    plan, out, rounds = args
    from planner.launchers import export_plan

    for _ in range(rounds):
        export_plan(plan, ["json", "megatron", "torchrun"], out, force=True)


def _consistent(files: dict[str, str]) -> bool:
    """Every header's plan digest is the plan_digest of the plan.json in the same set."""
    import re

    digest = json.loads(files["plan.json"])["plan_digest"]
    seen = {m for text in files.values() for m in re.findall(r"sha256 ([0-9a-f]{12})", text)}
    return seen == {digest}


def test_ten_concurrent_writers_never_leave_a_mixed_set(tmp_path):
    from planner.core.fileset import read_set
    from planner.search.request import Request
    from planner.search.solver import search
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.presets import PRESETS

    req = Request(model=PRESETS["llama3-8b"], cluster=make_cluster(load_hardware(), 16, 2),
                  top=10, refine=10, launcher="megatron")
    plans = search(req).plans
    assert len(plans) == 10
    out = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    with deadline(240):
        with ctx.Pool(10) as pool:
            pending = pool.map_async(_writer, [(p, out, 3) for p in plans])
            reads = 0
            while not pending.ready():
                try:
                    files = read_set(out)
                except Exception as e:  # not there yet: the first writer has not finished
                    assert reads == 0 and ("no plan3d export set" in str(e)
                                           or "incomplete" in str(e)), e
                    continue
                assert _consistent(files), "a reader saw a mixed set"
                reads += 1
            pending.get()
    final = read_set(out)
    assert set(final) == {"plan.json", "megatron_args.sh", "launch.sh", "job.sbatch"}
    assert _consistent(final)
    assert not [p for p in out.iterdir() if p.name.endswith((".tmp", ".plan3d-old"))]
    assert reads > 0


# --- solver scratch files ----------------------------------------------------------------------

@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_solver_files_are_removed_on_ctrl_c(monkeypatch, solver):
    import pulp

    from planner.partitioning import lexicographic

    seen = []

    def interrupted(self, solver=None, **kwargs):
        seen.append(getattr(solver, "tmpDir", None))
        if seen[-1] is not None:
            Path(solver.tmpDir, "model-pulp.mps").write_text("a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(pulp.LpProblem, "solve", interrupted)
    model = type("Model", (), {"prob": pulp.LpProblem("p")})()
    with pytest.raises(KeyboardInterrupt):
        lexicographic.run_milp(model, solver, lexicographic.Work())
    if solver == "cbc":
        assert seen and not os.path.exists(seen[0])
    else:  # HiGHS runs in process and writes no files: no scratch directory is made
        assert seen == [None]


def test_markup_in_an_output_path_is_printed_as_text(tmp_path):
    out = tmp_path / "[/bold]run"
    result = invoke(solve("--export", "json", "--out", out))
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert "[/bold]run" in result.stderr and (out / "plan.json").exists()


def test_a_new_set_replaces_the_old_one_whole_and_only_with_force(tmp_path):
    from planner.core.fileset import OutFile, read_set, write_set

    out = tmp_path / "run"
    write_set(out, [OutFile("plan.json", "1"), OutFile("megatron_args.sh", "old")])
    with pytest.raises(Exception, match="--force"):
        write_set(out, [OutFile("ds_config.json", "2")])
    write_set(out, [OutFile("ds_config.json", "2")], force=True)
    assert read_set(out) == {"ds_config.json": "2"}
    assert not (out / "megatron_args.sh").exists()  # a stale file would be sourced by launch.sh


def test_markup_in_a_stack_name_inside_a_rejection_reason_is_printed_as_text(tmp_path):
    """A user's stack name reaches the funnel's rejection line ("NAME runs no context
    parallelism"); it prints as typed, not as rich markup."""
    name = "[bold red]x[/]"
    stack = write(tmp_path, "s.json", {"base": "megatron-core", "name": name, "version": "1",
                                       "description": "d", "cp_comm": None})
    result = invoke(["solve", "--gpus", "16", "--nodes", "2", "--seq-len", "32768",
                     "--stack", str(stack)])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert f"{name} runs no context parallelism" in result.stdout
