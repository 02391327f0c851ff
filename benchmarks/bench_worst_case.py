"""The worst case of every input dimension (issue #12): each at its cap in core/limits.py, and
just beyond it, where the command must stop at once with one line. A table of wall-clock seconds,
exit codes and the first line of the answer; each case runs as its own `plan` process under a
timeout, so a dimension that is not bounded shows as a timeout instead of hanging the script.

Run: python benchmarks/bench_worst_case.py [--timeout S] [--only TEXT]
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

from planner.core.limits import (MAX_CHUNKS, MAX_FILE_BYTES, MAX_GPUS, MAX_JSON_DEPTH,
                                 MAX_LAYERS, MAX_MICROBATCHES)

TARGET_S = 5.0  # "a few seconds" of CPU (wall time on a shared machine says more about the load)


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
    return out


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
    ]


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(args: list[str], timeout: float) -> tuple[float, float, str, str]:
    """(wall seconds, CPU seconds, exit code or 'timeout', first line of the answer)."""
    command = [sys.executable, "-c", "from cli import app; app()", *args]
    start, cpu = time.perf_counter(), _child_cpu()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return (time.perf_counter() - start, float("nan"), "timeout",
                f"still running after {timeout:g} s")
    seconds, cpu = time.perf_counter() - start, _child_cpu() - cpu
    lines = [l for l in (done.stderr + done.stdout).splitlines() if l.strip()]
    first = next((l for l in lines if l.startswith(("error", "no feasible"))), lines[0] if lines
                 else "")
    return seconds, cpu, str(done.returncode), first.strip()[:90]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", default="", help="run the cases whose dimension has this text")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; target {TARGET_S:g} s (process start included; SLOW past it in CPU)")
    print(f"{'dimension':<16}{'case':<48}{'wall s':>8}{'CPU s':>8}{'exit':>8}  answer")
    with tempfile.TemporaryDirectory() as tmp:
        for dimension, case, argv in cases(_files(Path(tmp))):
            if args.only and args.only not in dimension:
                continue
            seconds, cpu, code, first = run(argv, args.timeout)
            flag = "" if cpu <= TARGET_S and code != "timeout" else "  SLOW"
            print(f"{dimension:<16}{case:<48}{seconds:>8.2f}{cpu:>8.2f}{code:>8}  {first}{flag}",
                  flush=True)


if __name__ == "__main__":
    main()
