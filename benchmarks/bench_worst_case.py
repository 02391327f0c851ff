"""The worst case of every input dimension (issues #12 and #31): each at its cap in core/limits.py
(or the cap beside its schema), and just beyond it, where the command must stop at once with one
line. A table of wall-clock and CPU seconds, peak resident memory, exit codes and the first line
of the answer; each case runs as its own `plan` process under a timeout, so a dimension that is
not bounded shows as a timeout instead of hanging the script. The verdict is issue #31's: under
30 s of wall time and 2 GiB of peak memory (the process's own, and any children it waited for).
Runs files are also tried at their work budget (planner/fidelity/work.py): the heaviest single
run it admits, and as many distinct pipeline shapes as it admits, each simulated anew.

`--ordinary` adds plain profiles of llama3-8b, -70b and -405b, whose time is their --budget-s
(minutes for 405b on 2 cores) and whose memory must stay under 4 GiB.

Run: python benchmarks/bench_worst_case.py [--timeout S] [--only TEXT] [--ordinary]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.core.limits import (MAX_CHUNKS, MAX_FILE_BYTES, MAX_GPUS, MAX_GPUS_PER_NODE,
                                 MAX_JSON_DEPTH, MAX_LAYERS, MAX_MICROBATCHES, MAX_PROFILE_TOKENS)
from planner.fidelity.calibrate import MAX_CALIBRATION_RUNS
from planner.fidelity.cases import DEFAULT_FILES, case_setup, load_cases
from planner.fidelity.runs_schema import MAX_CASES
from planner.fidelity.work import MAX_PIPELINE_OPS, case_work

TARGET_S = 30.0  # issue #31: every capped path under 30 s ...
TARGET_MIB = 2048.0  # ... and 2 GiB
ORDINARY_MIB = 4096.0  # an ordinary profile, llama3-405b's included, under 4 GiB
# The child reports its own peak (and its waited-for children's) as it exits
# (VmHWM, the high-water mark of this process's own memory since its exec: ru_maxrss would
# count the forking benchmark's memory too, which Linux carries across exec).
CHILD = ("import atexit, resource, sys\n"
         "def peak():\n"
         "    kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
         "    try:\n"
         "        for line in open('/proc/self/status'):\n"
         "            if line.startswith('VmHWM:'):\n"
         "                kib = max(kib, int(line.split()[1]))\n"
         "    except OSError:\n"
         "        kib = max(kib, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
         "    sys.stderr.write(f'\\n@peak_kib {kib}\\n')\n"
         "atexit.register(peak)\n"
         "from cli import app\n"
         "app()\n")


def _runs(tmp: Path) -> dict[str, Path]:
    """Runs files at and beyond their caps, from the bundled runs (renamed copies)."""
    bundled = [c for f in DEFAULT_FILES for c in load_cases(f)]
    a100 = [c for c in bundled if c["cluster"].get("gpu") == "A100-SXM4-80GB"]

    def copies(runs: list[dict], n: int) -> list[dict]:
        return [{**runs[i % len(runs)], "name": f"{runs[i % len(runs)]['name']}-{i}"}
                for i in range(n)]

    megatron = next(c for c in bundled if c["name"] == "megatron2021-table1-39.1B")
    every_cap = json.loads(json.dumps(megatron))  # 1,024 layers, 256 chunks, ~10^6 microbatches
    every_cap["model"]["layers"] = MAX_LAYERS
    every_cap["config"].update(pp=MAX_CHUNKS // 2, dp=1, virtual_stages=None,  # v = 2 chosen
                               global_batch=MAX_MICROBATCHES // (MAX_CHUNKS // 2)
                               * (MAX_CHUNKS // 2))
    every_cap["cluster"]["gpus"] = every_cap["config"]["tp"] * MAX_CHUNKS // 2
    huge_v = json.loads(json.dumps(megatron))
    huge_v["config"].update(virtual_stages=1e15, schedule="interleaved")
    zb = next(c for c in bundled if c["name"] == "zerobubble-1.5B-ZB-2p-m24")
    # torch 2.6's lockstep time steps: a table of M x chunks slots, walked with its steady
    # periods skipped (planner/pipeline/timestep.py); at 128 ranks its bound is over the budget
    timesteps_at_cap = json.loads(json.dumps(every_cap))
    timesteps_at_cap["stack_overrides"] = {"pipeline_timesteps": True}
    timesteps = json.loads(json.dumps(every_cap))
    timesteps["config"].update(pp=8, global_batch=8 * 125_000)
    timesteps["cluster"]["gpus"] = timesteps["config"]["tp"] * 8
    timesteps["stack_overrides"] = {"pipeline_timesteps": True}
    # plan calibrate prices each run up to CALIBRATION_PRICINGS times, walking a time-step table
    # each time: 16 runs (the most refitted one by one), 13 of them on time steps at M 8
    calibrate_timesteps = [json.loads(json.dumps(timesteps)) for _ in range(13)]
    for n, run in enumerate(calibrate_timesteps):
        run.update(name=f"timesteps-{n}")
        run["model"]["layers"] = 64
        run["config"]["global_batch"] = 8
    calibrate_timesteps += [c for c in a100 if c["group"] == "megatron2021_table1"][:3]
    docs = {"runs-at-cap": copies(bundled, MAX_CASES), "runs-over-cap": copies(bundled, MAX_CASES + 1),
            "calibrate-at-cap": copies(a100, MAX_CALIBRATION_RUNS),
            "calibrate-over-cap": copies(a100, MAX_CALIBRATION_RUNS + 1),
            "run-at-every-cap": [every_cap], "virtual-stages-1e15": [huge_v],
            "heaviest-run": [_zero_bubble(zb, "ZB-2p", MAX_CHUNKS, "zb2p-256")],
            "distinct-shapes": _distinct_shapes(zb), "timesteps-1e6": [timesteps],
            "over-budget": [timesteps_at_cap],
            "calibrate-timesteps": calibrate_timesteps}
    out = {}
    for name, doc in docs.items():
        out[name] = tmp / f"{name}.json"
        out[name].write_text(json.dumps(doc))
    return out


def _zero_bubble(zb: dict, schedule: str, pp: int, name: str) -> dict:
    """The zero-bubble run's model, 1,024 layers deep, on a pp-stage pipeline of ``schedule``
    ("1F1B", "ZB-1p", "ZB-2p") and MAX_MICROBATCHES microbatches: a long periodic run."""
    run = json.loads(json.dumps(zb))
    run["name"] = name
    run["model"]["layers"] = MAX_LAYERS
    run["config"].update(pp=pp, dp=1, schedule=schedule, micro_batch=1,
                         global_batch=MAX_MICROBATCHES)
    run["cluster"]["gpus"] = pp
    return run


def _distinct_shapes(zb: dict) -> list[dict]:
    """Runs of as many distinct pipeline shapes as the work budget (fidelity/work.py) admits,
    none more than a 32nd of it, heaviest first: each shape simulated anew, more shapes than
    the simulator's memo holds."""
    shapes = [(case_work(case_setup(run)), run) for pp in range(MAX_CHUNKS, 1, -1)
              for schedule in ("ZB-2p", "ZB-1p", "1F1B")
              for run in [_zero_bubble(zb, schedule, pp, f"{schedule}-pp{pp}")]]
    runs, total = [], 0
    for work, run in sorted(shapes, key=lambda s: -s[0]):
        if work <= MAX_PIPELINE_OPS // 32 and total + work <= MAX_PIPELINE_OPS \
                and len(runs) < MAX_CASES:
            runs.append(run)
            total += work
    return runs


def _files(tmp: Path) -> dict[str, Path]:
    """Input files at and beyond the caps."""
    base = {"hidden_size": 512, "num_attention_heads": 8, "vocab_size": 32000, "seq_length": 2048}
    files = {
        "layers-at-cap": {**base, "name": "deep", "num_layers": MAX_LAYERS},
        "layers-100k": {**base, "name": "deeper", "num_layers": 100_000},
    }
    out = {}
    for name, doc in files.items():
        out[name] = tmp / f"{name}.json"
        out[name].write_text(json.dumps(doc))
    big = tmp / "model-16mib.json"  # valid JSON padded with whitespace to just under the cap
    text = json.dumps({**base, "name": "padded", "num_layers": 8})
    big.write_text(text + " " * (MAX_FILE_BYTES - len(text) - 1))
    out["model-16mib"] = big
    over = tmp / "model-17mib.json"
    over.write_text(text + " " * (MAX_FILE_BYTES + 2**20))
    out["model-17mib"] = over
    deep = tmp / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    out["json-100k-deep"] = deep
    fifo = tmp / "fifo.json"
    os.mkfifo(fifo)
    out["fifo"] = fifo
    lockstep = tmp / "lockstep.json"  # megatron-core's stack on torch 2.6's time steps
    lockstep.write_text(json.dumps({"base": "megatron-core", "name": "lockstep", "version": "1",
                                    "description": "megatron-core priced on lockstep time steps",
                                    "pipeline_timesteps": True}))
    out["lockstep-stack"] = lockstep
    small = tmp / "small.json"  # a 4-block model of hidden 512 for the profiler at its token cap
    small.write_text(json.dumps({**base, "name": "small", "num_layers": 4}))
    out["small"] = small
    return {**out, **_runs(tmp)}


def cases(files: dict[str, Path]) -> list[tuple[str, str, list[str]]]:
    """(dimension, case, plan arguments)."""
    g = str(MAX_GPUS)
    return [
        ("GPUs", f"--gpus {MAX_GPUS} (cap), --json --top 10",
         ["solve", "--gpus", g, "--nodes", str(MAX_GPUS // 8), "--global-batch",
          str(2 * MAX_GPUS), "--json", "--top", "10", "--refine", "2"]),
        ("GPUs", "--gpus 10^12 (refused)", ["solve", "--gpus", str(10**12), "--nodes", "1"]),
        ("layers", f"{MAX_LAYERS} blocks (cap)",
         ["solve", "--model", str(files["layers-at-cap"]), "--gpus", "64", "--nodes", "8",
          "--refine", "2"]),
        ("layers", "100,000 blocks (refused)",
         ["solve", "--model", str(files["layers-100k"]), "--gpus", "8", "--nodes", "1"]),
        ("global batch", "--global-batch 10^15 (every M over the cap)",
         ["solve", "--gpus", "16", "--nodes", "2", "--global-batch", str(10**15)]),
        ("global batch", "--global-batch 1000003 (prime) on 16 GPUs",
         ["solve", "--gpus", "16", "--nodes", "2", "--global-batch", "1000003"]),
        ("time steps", "solve on torch 2.6 time steps, global batch 65,536",
         ["solve", "--gpus", "16", "--nodes", "2", "--global-batch", "65536", "--stack",
          str(files["lockstep-stack"])]),
        ("microbatches", f"simulate M = {MAX_MICROBATCHES:,} (cap; issue #17)",
         ["simulate", "--pp", "4", "--microbatches", str(MAX_MICROBATCHES), "--json"]),
        ("microbatches", "simulate M = 10^7 (refused)",
         ["simulate", "--pp", "4", "--microbatches", str(10**7)]),
        ("pipeline chunks", f"simulate pp = {MAX_CHUNKS} (cap), M = {MAX_CHUNKS}",
         ["simulate", "--pp", str(MAX_CHUNKS), "--microbatches", str(MAX_CHUNKS), "--json"]),
        ("pipeline chunks", "simulate pp = 10^6 (refused)",
         ["simulate", "--pp", str(10**6), "--microbatches", "4"]),
        ("rank layout", "layout tp 8 pp 10^6 dp 10^6 (refused)",
         ["layout", "--tp", "8", "--pp", str(10**6), "--dp", str(10**6)]),
        ("file size", "16 MiB model.json (cap)",
         ["solve", "--model", str(files["model-16mib"]), "--gpus", "8", "--nodes", "1",
          "--refine", "2"]),
        ("file size", "17 MiB model.json (refused)",
         ["solve", "--model", str(files["model-17mib"]), "--gpus", "8", "--nodes", "1"]),
        ("JSON nesting", f"100,000 levels (refused; cap {MAX_JSON_DEPTH})",
         ["solve", "--model", str(files["json-100k-deep"]), "--gpus", "8", "--nodes", "1"]),
        ("special files", "--model /dev/zero (refused)",
         ["solve", "--model", "/dev/zero", "--gpus", "8", "--nodes", "1"]),
        ("special files", "--model FIFO (refused)",
         ["solve", "--model", str(files["fifo"]), "--gpus", "8", "--nodes", "1"]),
        ("GPUs per node", f"layout --gpus-per-node {MAX_GPUS_PER_NODE} (cap)",
         ["layout", "--tp", "8", "--pp", "4", "--dp", "32", "--gpus-per-node",
          str(MAX_GPUS_PER_NODE)]),
        ("GPUs per node", "layout --gpus-per-node 10^6 (refused)",
         ["layout", "--tp", "2", "--pp", "4", "--dp", "2", "--gpus-per-node", str(10**6)]),
        ("degrees", "partition --tp 10^20 (refused)",
         ["partition", "--tp", str(10**20), "--pp", "2"]),
        ("profile tokens", f"small model, --seq-len {MAX_PROFILE_TOKENS:,} (cap), budget 1 s",
         ["profile", str(files["small"]), "--seq-len", str(MAX_PROFILE_TOKENS), "--budget-s", "1",
          "--repeats", "3"]),
        ("profile tokens", "--micro-batch 10^6 (refused)",
         ["profile", "llama3-8b", "--micro-batch", str(10**6)]),
        ("profile tokens", "--seq-len 2^24 (refused)",
         ["profile", "llama3-8b", "--seq-len", str(2**24)]),
        ("calibrate runs", f"{MAX_CALIBRATION_RUNS} A100 runs (cap), three factors",
         ["calibrate", "--runs", str(files["calibrate-at-cap"])]),
        ("calibrate runs", "16 runs, 13 on torch 2.6 time steps (M 8), in budget",
         ["calibrate", "--runs", str(files["calibrate-timesteps"])]),
        ("calibrate runs", f"{MAX_CALIBRATION_RUNS + 1} runs (refused)",
         ["calibrate", "--runs", str(files["calibrate-over-cap"])]),
        ("validate runs", f"{MAX_CASES} runs (cap), the bundled repeated",
         ["validate", str(files["runs-at-cap"])]),
        ("validate runs", f"{MAX_CASES + 1} runs (refused)", ["validate", str(files["runs-over-cap"])]),
        ("validate runs", "one run at every cap (1,024 layers, 256 chunks, M ~10^6)",
         ["validate", str(files["run-at-every-cap"])]),
        ("validate runs", "heaviest run in budget: zb-2p, pp 256, M 10^6",
         ["validate", str(files["heaviest-run"])]),
        ("validate runs", f"{MAX_PIPELINE_OPS:,} pipeline ops (budget), distinct shapes",
         ["validate", str(files["distinct-shapes"])]),
        ("validate runs", "time steps, pp 8, M 10^6 (in budget: periods skipped)",
         ["validate", str(files["timesteps-1e6"])]),
        ("validate runs", "time steps at every cap, pp 128 (refused: over budget)",
         ["validate", str(files["over-budget"])]),
        ("runs degrees", "virtual_stages 1e15 (refused)",
         ["validate", str(files["virtual-stages-1e15"])]),
    ]


def ordinary() -> list[tuple[str, str, list[str]]]:
    """Plain profiles: memory under ORDINARY_MIB, time whatever their budget makes it."""
    return [("ordinary profile", f"{m}, --budget-s 1 --repeats 3",
             ["profile", m, "--budget-s", "1", "--repeats", "3"])
            for m in ("llama3-8b", "llama3-70b", "llama3-405b")]


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(args: list[str], timeout: float) -> tuple[float, float, float, str, str]:
    """(wall seconds, CPU seconds, peak MiB, exit code or 'timeout', first line of the answer)."""
    command = [sys.executable, "-c", CHILD, *args]
    start, cpu = time.perf_counter(), _child_cpu()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return (time.perf_counter() - start, float("nan"), float("nan"), "timeout",
                f"still running after {timeout:g} s")
    seconds, cpu = time.perf_counter() - start, _child_cpu() - cpu
    peak = float("nan")
    lines = []
    for line in (done.stderr + done.stdout).splitlines():
        if line.startswith("@peak_kib "):
            peak = int(line.split()[1]) / 1024
        elif line.strip():
            lines.append(line)
    first = next((l for l in lines if l.startswith(("error", "no feasible"))), lines[0] if lines
                 else "")
    return seconds, cpu, peak, str(done.returncode), first.strip()[:90]


def verdict(seconds: float, peak: float, code: str, limit_mib: float, limit_s: float) -> str:
    if code == "timeout":
        return "TIMEOUT"
    if not peak <= limit_mib:
        return f"OVER {limit_mib / 1024:g} GiB"
    return "ok" if seconds <= limit_s else f"OVER {limit_s:g} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", default="", help="run the cases whose dimension has this text")
    parser.add_argument("--ordinary", action="store_true",
                        help="also profile llama3-8b, -70b and -405b (minutes)")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}; verdict: under "
          f"{TARGET_S:g} s wall and {TARGET_MIB / 1024:g} GiB peak (ordinary profiles: "
          f"{ORDINARY_MIB / 1024:g} GiB)")
    print(f"{'dimension':<17}{'case':<58}{'wall s':>7}{'CPU s':>7}{'peak MiB':>9}{'exit':>5}"
          f"  {'verdict':<10} answer")
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(*case, TARGET_MIB, TARGET_S) for case in cases(_files(Path(tmp)))]
        if args.ordinary:
            todo += [(*case, ORDINARY_MIB, float("inf")) for case in ordinary()]
        for dimension, case, argv, limit_mib, limit_s in todo:
            if args.only and args.only not in dimension:
                continue
            timeout = args.timeout if limit_s < float("inf") else max(args.timeout, 3600.0)
            seconds, cpu, peak, code, first = run(argv, timeout)
            print(f"{dimension:<17}{case:<58}{seconds:>7.2f}{cpu:>7.2f}{peak:>9.0f}{code:>5}  "
                  f"{verdict(seconds, peak, code, limit_mib, limit_s):<10} {first}", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
