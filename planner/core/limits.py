"""Every cap on the size of the work plan3d accepts, and on the seconds and FLOPs it computes with,
in one place, each with its reason.

Inputs beyond these are no real training run but a typo or an attack; a size beyond its cap would
make a command run for minutes or hours, a number beyond its cap would turn into inf or NaN in a
table, a JSON or a chart. Past a cap the command stops at once with one line naming the input
(exit 2). benchmarks/bench_worst_case.py times each dimension at its cap.
"""

from __future__ import annotations

# GPUs in one job. Llama 3 405B trained on 16,384 H100s (Llama 3 paper, sec. 3.3); 2^15 = 32,768
# is twice that. Every plan's JSON lists each rank's place (layout/ranks.py): at 2^16 GPUs
# `solve --json --top 10` took ~10 s of CPU, at 2^15 about half (benchmarks/bench_worst_case.py),
# and a million GPUs with a batch that fits ran for more than 5 minutes.
MAX_GPUS = 2**15
# GPUs in one node (or one NVLink domain's node entry): a GB200 NVL72 rack is 72; a layout draws a
# column per GPU of a node, so a million per node drew for minutes (issue #31)
MAX_GPUS_PER_NODE = 1024
# Llama 3 405B has 126 blocks, Megatron's 1T model 128; 1,024 layers bounds the partitioner.
MAX_LAYERS = 1024
# Pipeline chunks, pp x virtual stages. The deepest published pipelines have a few dozen (Megatron
# 1T: pp 64; the zero-bubble runs: one layer per chunk, 30-ish); the op-by-op simulator's work grows
# with chunks x M, and 256 chunks x 256 microbatches simulate in ~1 s of CPU.
MAX_CHUNKS = 256
# Microbatches per step. Not lower: issue #17 makes the simulator's cost independent of M beyond
# its steady state, and 10^6 is the floor the project agreed on.
MAX_MICROBATCHES = 10**6
# Input files: the largest bundled one (a runs file) is ~100 KiB.
MAX_FILE_BYTES = 16 * 2**20
# JSON nesting: the deepest bundled input nests 4 levels.
MAX_JSON_DEPTH = 32
# Names (model, GPU, run): longer than any in use, shorter than a terminal line twice over.
MAX_NAME = 256

# Seconds of one pass of one pipeline chunk or layer for one microbatch (`plan simulate
# --stage-times`, a profile's per-layer times) and of one transfer (`--comm-time`). Measured ones
# are milliseconds to seconds; a 405B block at 8K tokens on a 2-core CPU takes ~10^3 s. 10^6 s
# (11.6 days) is three orders beyond, and keeps every sum the simulator and the search form
# finite: x 256 chunks x 10^6 microbatches x 3 passes is < 10^15 s, where 10^308 was inf.
MAX_PASS_S = 1e6
# The shortest such pass: a nanosecond, below one GPU kernel launch (~5 us), so no real pass.
# Below it the chart's scale (pixels per second of the step) overflows: 5e-324 s drew NaN.
MIN_PASS_S = 1e-9
# FLOPs and bytes of one layer pass in a profile. A 1T-parameter model's block (~8e9 parameters)
# over 10^6 tokens is 2 x 8e9 x 1e6 = 1.6e16 FLOPs; 10^20 leaves four orders of room, and a sum
# over 1,024 layers stays finite.
MAX_PASS_FLOPS = 1e20
# The slowest rate a profiled pass may claim (its FLOPs / its seconds): a megaflop per second, a
# 1990s PC's. The planner scales a pass to the planned shape as seconds x FLOPs now / FLOPs then,
# so 10^-300 FLOPs in 10^6 s scaled to inf; at this floor a 10^20-FLOP pass is 10^14 s, finite.
MIN_PASS_RATE = 1e6
# `plan profile --budget-s`: the seconds spent measuring one distinct layer. A model has a few
# distinct layers (embedding, block, head), so an hour each is a profile of hours, the longest
# anyone waits; the default is 10 s. Past it (10^308) the repeat count overflowed an int.
MAX_BUDGET_S = 3600.0
# Tokens of one profiled micro-batch, `plan profile --micro-batch` x `--seq-len`. Llama 3 405B's
# longest context is 128K tokens (Llama 3 paper, sec. 3.4.2), 2^17; 2^20 is eight times that. The
# profiler measures a long sequence's attention at its full length (fewer heads), so tokens
# beyond it are no training run, and 10^6 x 8,192 held gigabytes before measuring (issue #31).
MAX_PROFILE_TOKENS = 2**20
# Bytes one profiled measurement may hold on the CPU (weights, gradients, activations). Layers
# over it hold their weights as column tiles (planner/profiling/tiled.py), timed tile by tile at
# the full work; llama3-405b's 3.2-billion-parameter block once took 24 GiB and more (issue #31).
# 1.5 GiB keeps a profile's peak resident memory under 2 GiB with the interpreter and numpy.
MAX_PROFILE_BYTES = 1.5 * 2**30
# Points of one `plan sweep` spec (the product of its lists and ranges) unless --max-points raises
# it: a typo in a range (to: 4096000) is refused in one line, not solved for hours. Here, not in
# planner/sweeping/spec.py, so `plan sweep --help` shows the default without loading the sweeping.
DEFAULT_MAX_POINTS = 10_000
