"""Prediction fidelity: the cost model against published (or the user's own) training runs.

Each case (planner/fidelity/cases.py) is evaluated op by op and compared with what its source
measured: step time, TFLOP/s per GPU in the source's own definition, and per-GPU memory where it
was published; then summarised (mean and worst error, memory range, rank correlation within
sweeps, runs that ran but are predicted out of memory). ``plan validate --stack`` prices every case
on one stack instead of its own.

Pure functions over frozen dataclasses; planner/report/validation.py renders the result (a rich
table, or markdown for the README) from the rows' DataFrame.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.core.units import GIB
from planner.cost import constants
from planner.fidelity.case_cluster import base_profile
from planner.fidelity.case_setup import CaseSetup
from planner.fidelity.case_stack import case_stack
from planner.fidelity.cases import DEFAULT_FILES, case_setup, load_cases
from planner.fidelity.work import check_work
from planner.hardware.profiles import Hardware
from planner.predict.step import predict_plan
from planner.stack import Stack

# How each file is named in the summary's per-group lines.
DATASET_LABELS = {"published_runs": "old", "modern_runs": "modern", "moe_runs": "moe"}

# Published memory is read as GiB (2^30 bytes): BLOOM's chronicles quote nvidia-smi, which reports
# MiB, and the zero-bubble Table 4 comes from PyTorch's allocator statistics, also binary units.
# Reading them as GiB is also the strict choice for "never under-estimated": a GiB is the larger
# unit, so an under-estimate in GiB is at least as large as one in 10^9 bytes.
MEMORY_UNIT_BYTES = GIB


@dataclass(frozen=True)
class ValidationRow:
    """One case: measured against predicted. Errors are signed fractions (predicted/measured-1)."""

    case: str
    group: str
    sweep: str
    configuration: str
    measured_step_s: float
    predicted_step_s: float | None
    measured_tokens_per_s: float
    predicted_tokens_per_s: float | None
    tflops_definition: str  # "hardware" (recompute counted) or "model"
    measured_tflops: float | None
    predicted_tflops: float | None
    measured_memory_gib: float | None
    predicted_memory_gib: float | None
    predicted_oom: bool
    note: str
    dataset: str = ""  # which file: "old" (published_runs.json) or "modern" (modern_runs.json)
    stack: str = ""  # the stack it was priced on, with its overrides (Stack.label)
    precision: str = "bf16"  # the block GEMMs' precision on that stack ("fp8" for FP8 runs)
    stack_name: str = ""  # that stack's name, without its overrides (Stack.name)
    hardware: str = ""  # the GPU profile it was priced on (the bundled one of its kind, or yours)
    moe: bool = False  # the model routes experts
    gpus: int = 0  # the run's GPUs

    @property
    def supported(self) -> bool:
        return self.predicted_step_s is not None

    @property
    def time_error(self) -> float | None:
        if self.predicted_step_s is None:
            return None
        return self.predicted_step_s / self.measured_step_s - 1

    @property
    def memory_error(self) -> float | None:
        if self.predicted_memory_gib is None or self.measured_memory_gib is None:
            return None
        return self.predicted_memory_gib / self.measured_memory_gib - 1


@dataclass(frozen=True)
class ValidationSummary:
    """Fidelity over the evaluated cases; ``spearman`` maps each sweep to its rank correlation
    between predicted and measured speed (tokens/s), for sweeps of three or more cases."""

    cases: int
    evaluated: int
    skipped: tuple[str, ...]
    mean_abs_time_error: float
    max_abs_time_error: float
    worst_case: str
    memory_cases: int
    min_memory_error: float | None  # most negative = worst under-estimate
    max_memory_error: float | None
    spearman: tuple[tuple[str, float], ...]
    oom_mismatches: tuple[str, ...]  # published runs ran, so any predicted OOM is a miss
    # the same summary per dataset ("old", "modern"), when the rows come from more than one
    groups: tuple[tuple[str, ValidationSummary], ...] = ()
    skip_reasons: tuple[str, ...] = ()  # why each skipped case was skipped (same order)
    # the same with each source held out (planner/fidelity/holdout.py), where it was priced
    held_out_mean_abs_time_error: float | None = None
    held_out_max_abs_time_error: float | None = None


# --- evaluating ----------------------------------------------------------------------------------


def _hardware_definition(case: dict) -> bool:
    """Whether the source's TFLOP/s count the recomputed forward (Megatron eq. 3 convention)."""
    text = str(case["measured"].get("tflops_definition") or "").lower()
    return any(k in text for k in ("eq.(3)", "eq.3", "eq. 3", "recompute-inclusive",
                                   "counts the recompute", "hardware"))


def _configuration(par: Parallel) -> str:
    cp = f" cp{par.cp}" if par.cp > 1 else ""
    text = f"tp{par.tp}{cp} pp{par.pp} dp{par.dp} mb{par.micro_batch} M{par.num_microbatches} " \
           f"{par.schedule}"
    if par.virtual_stages > 1:
        text += f" v{par.virtual_stages}"
    return text + f" {par.recompute} ZeRO-{par.zero}"


def _predicted(setup: CaseSetup, simulated: bool) -> tuple[float, float, float, float, float]:
    """(step s, MFU, HFU, peak bytes, peak reserved bytes) of a case's configuration: the peak
    that must fit, and that peak as the allocator reserves it (planner/cost/side_streams.py)."""
    layers = None if setup.recompute_layers is None else \
        [setup.recompute_layers] * setup.parallel.num_chunks
    plan, pred = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                              bounds=list(setup.bounds) if setup.bounds else None,
                              simulated=simulated, recompute_layers=layers)
    mt, runs = plan.metrics, setup.pipeline_passes
    # several pipeline runs a step (moe_cases.local_batch_passes): the pipeline repeats, the DP sync
    # and the optimizer step do not; FLOPs scale with the runs
    step = mt.step_time_s + (runs - 1) * pred.pipeline_s
    scale = runs * mt.step_time_s / step
    return step, mt.mfu * scale, mt.hfu * scale, mt.peak_memory_bytes, pred.peak_reserved_bytes


def validate_case(case: dict, simulated: bool = True, dataset: str = "",
                  hardware: Hardware | None = None, stack: Stack | None = None,
                  setup: CaseSetup | None = None) -> ValidationRow:
    """Evaluate one published case on its stack (or ``stack``) and compare it with what was
    measured (on ``hardware``, a calibrated profile, instead of the bundled profile of its GPU
    kind, when given); ``setup``: the case's own case_setup, where the caller has it."""
    setup = setup or case_setup(case, hardware, stack)
    me = case["measured"]
    measured_s = float(me["step_time_s"])
    tokens = case["config"]["global_batch"] * case["model"]["seq_len"]
    mem = me.get("memory_gb_per_gpu")
    hardware_def = _hardware_definition(case)
    priced_on = case_stack(case, stack)
    common = dict(case=setup.name, group=setup.group, sweep=setup.sweep, dataset=dataset,
                  stack=priced_on.label(), precision=priced_on.precision,
                  stack_name=priced_on.name,
                  hardware=hardware.name if hardware else base_profile(
                      str(case["cluster"].get("gpu", ""))),
                  measured_step_s=measured_s, measured_tokens_per_s=tokens / measured_s,
                  tflops_definition="hardware" if hardware_def else "model",
                  measured_tflops=me.get("tflops_per_gpu"),
                  measured_memory_gib=_memory_gib(me), gpus=int(case["cluster"].get("gpus") or 0),
                  moe=setup.model is not None and any(layer.is_moe for layer in setup.model.layers))
    if setup.unsupported:
        return ValidationRow(configuration=str(case["config"].get("schedule")),
                             predicted_step_s=None, predicted_tokens_per_s=None,
                             predicted_tflops=None, predicted_memory_gib=None,
                             predicted_oom=False,
                             note="; ".join(("skipped: " + setup.unsupported,) + setup.notes),
                             **common)
    step, mfu, hfu, peak_bytes, reserved_bytes = _predicted(setup, simulated)
    if setup.recompute_guessed and peak_bytes > setup.cluster.hardware.memory_bytes:
        # the run fitted, so it recomputed: the guess moves to the least recompute that fits
        setup, (step, mfu, hfu, peak_bytes, reserved_bytes) = _least_recompute(setup, simulated)
    peak = setup.cluster.hardware.peak_tflops
    # measured memory is the allocator's reserve or the device's use: side streams included
    predicted_mem = _comparable_memory_bytes(reserved_bytes, me) / MEMORY_UNIT_BYTES
    config = _configuration(setup.parallel)
    if setup.recompute_layers is not None:
        config = config.replace(" full ZeRO", f" block {setup.recompute_layers} ZeRO")
    return ValidationRow(
        configuration=config, predicted_step_s=step, predicted_tokens_per_s=tokens / step,
        predicted_tflops=(hfu if hardware_def else mfu) * peak,
        predicted_memory_gib=predicted_mem if mem is not None else None,
        predicted_oom=peak_bytes > setup.cluster.hardware.memory_bytes,
        note="; ".join(setup.notes), **common)


def _least_recompute(setup: CaseSetup, simulated: bool) -> tuple[CaseSetup, tuple]:
    """An unpublished recompute where none does not fit: the least Megatron block-method count N
    (the first N blocks of every chunk recompute, one N for all chunks as Megatron's
    --recompute-num-layers sets it) whose peak fits the GPU, found by bisection (memory falls as
    N grows); full recompute when only every block fits or nothing does. What it returns is
    evaluated."""
    notes = tuple(n for n in setup.notes if not n.startswith("recompute unpublished"))
    full = replace(setup, parallel=replace(setup.parallel, recompute="full"))
    bounds = list(setup.bounds) if setup.bounds else None
    most = _most_blocks(setup.model, setup.parallel.num_chunks, bounds)
    capacity = setup.cluster.hardware.memory_bytes
    lo, hi, best = 1, most - 1, None  # N in [1, most - 1]; most is full recompute
    while lo <= hi:
        mid = (lo + hi) // 2
        got = _predicted(replace(full, recompute_layers=mid), simulated)
        if got[3] <= capacity:
            best, hi = (mid, got), mid - 1
        else:
            lo = mid + 1
    if best is None:
        return (replace(full, notes=notes + ("recompute unpublished: full (none would not fit)",)),
                _predicted(full, simulated))
    n, got = best
    return (replace(full, recompute_layers=n,
                    notes=notes + (f"recompute unpublished: block {n} (the least Megatron "
                                   "--recompute-num-layers that fits; none would not fit)",)),
            got)


def _most_blocks(model, chunks: int, bounds) -> int:
    """The most transformer blocks any chunk of the case's split holds."""
    from planner.predict.chunks import even_block_bounds

    bounds = bounds or even_block_bounds(model, chunks)
    return max(sum(1 for layer in model.layers[a:b] if layer.kind == "block") for a, b in bounds)


def _comparable_memory_bytes(peak_bytes: float, measured: dict) -> float:
    """The predicted peak as the source counts memory. "device" (nvidia-smi, the default): all
    of it. "allocator": PyTorch's caching-allocator reserve, which torchtitan logs
    ('max_reserved = device_info["reserved_bytes.all.peak"]', torchtitan/metrics.py
    DeviceMemoryMonitor.get_peak_stats; the 'memory: ...GiB' of its log line is
    max_reserved_gib, train.py): "the current GPU memory managed by the caching allocator"
    (torch.cuda.memory_reserved docs), without what the framework holds outside it (the CUDA
    context and NCCL's buffers: cost/constants.py RESERVED_BYTES), which is left out."""
    if measured.get("memory_scope") == "allocator":
        return max(peak_bytes - constants.RESERVED_BYTES, 0.0)
    return peak_bytes


def _memory_gib(measured: dict) -> float | None:
    """Published memory in GiB: modern_runs.json keeps the source's GiB as
    ``memory_gib_per_gpu`` (torchtitan logs GiB); published_runs.json's ``memory_gb_per_gpu`` is
    read as GiB (MEMORY_UNIT_BYTES)."""
    if measured.get("memory_gib_per_gpu") is not None:
        return float(measured["memory_gib_per_gpu"])
    mem = measured.get("memory_gb_per_gpu")
    return float(mem) if mem is not None else None


def validate_cases(cases: list[dict], simulated: bool = True, dataset: str = "",
                   hardware: Hardware | None = None, stack: Stack | None = None,
                   progress=None, setups: list[CaseSetup] | None = None
                   ) -> tuple[ValidationRow, ...]:
    """Every case predicted; ``progress(n)`` before each (the CLI's bar). Their work is checked
    against the budget (fidelity/work.py) before the first is priced, unless the caller gives
    their ``setups`` (case_setup's, in order), having checked them."""
    if setups is None:
        setups = case_setups(cases, hardware, stack)
        check_work(setups, f"{dataset or 'the runs'} ({len(cases)} runs)")
    rows = []
    for n, (case, setup) in enumerate(zip(cases, setups)):
        if progress:
            progress(n)
        rows.append(_checked(lambda: validate_case(case, simulated, dataset, hardware, stack,
                                                   setup), case, n))
    return tuple(rows)


def case_setups(cases: list[dict], hardware: Hardware | None = None,
                stack: Stack | None = None) -> list[CaseSetup]:
    """Each case's case_setup, before anything is priced."""
    return [_checked(lambda: case_setup(case, hardware, stack), case, n)
            for n, case in enumerate(cases)]


def _checked(work, case, n: int):
    """``work()``; a malformed case's KeyError, TypeError or ValueError as one PlanInputError."""
    try:
        return work()
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, PlanInputError):
            raise
        name = case.get("name", f"case {n}") if isinstance(case, dict) else f"case {n}"
        raise PlanInputError(f"{name}: not a published-run record ({type(e).__name__}: {e}); "
                             "see profiles/validation/published_runs.json for the format")


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the (tie-averaged) ranks."""
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else 0.0


def summarize(rows: tuple[ValidationRow, ...] | list[ValidationRow],
              held_out: tuple[ValidationRow, ...] | None = None) -> ValidationSummary:
    """Overall fidelity, and per dataset in ``groups`` when the rows come from several files;
    ``held_out`` (the rows priced with each source held out) adds the held-out errors."""
    held = {r.case: r for r in held_out} if held_out is not None else None
    labels = list(dict.fromkeys(r.dataset for r in rows))
    groups = tuple((label, _summarize([r for r in rows if r.dataset == label], held))
                   for label in labels) if len(labels) > 1 else ()
    fp8 = [r for r in rows if r.precision == "fp8"]
    if fp8 and len(fp8) < len(rows):  # the FP8 runs on their own (cost/precision.py)
        groups += (("fp8 runs", _summarize(fp8, held)),)
    return replace(_summarize(rows, held), groups=groups)


def _summarize(rows, held: dict | None = None) -> ValidationSummary:
    done = [r for r in rows if r.supported]
    errors = [abs(r.time_error) for r in done]
    worst = max(done, key=lambda r: abs(r.time_error)) if done else None
    mem = [r.memory_error for r in done if r.memory_error is not None]
    sweeps: dict[str, list[ValidationRow]] = {}
    for r in done:
        sweeps.setdefault(r.sweep, []).append(r)
    rho = tuple((k, spearman([r.predicted_tokens_per_s for r in v],
                             [r.measured_tokens_per_s for r in v]))
                for k, v in sorted(sweeps.items()) if k and len(v) >= 3)
    return ValidationSummary(
        cases=len(rows), evaluated=len(done),
        skipped=tuple(r.case for r in rows if not r.supported),
        mean_abs_time_error=sum(errors) / len(errors) if errors else 0.0,
        max_abs_time_error=max(errors, default=0.0),
        worst_case=worst.case if worst else "",
        memory_cases=len(mem), min_memory_error=min(mem, default=None),
        max_memory_error=max(mem, default=None), spearman=rho,
        oom_mismatches=tuple(r.case for r in done if r.predicted_oom),
        skip_reasons=tuple(r.note.split(";")[0].removeprefix("skipped: ")
                           for r in rows if not r.supported),
        **_held_out_errors(done, held))


def _held_out_errors(done, held: dict | None) -> dict:
    if held is None or not done:
        return {}
    errors = [abs(held[r.case].time_error) for r in done]
    return dict(held_out_mean_abs_time_error=sum(errors) / len(errors),
                held_out_max_abs_time_error=max(errors))


def validate_file(path=DEFAULT_FILES, simulated: bool = True, hardware: Hardware | None = None,
                  stack: Stack | None = None, progress=None
                  ) -> tuple[tuple[ValidationRow, ...], ValidationSummary]:
    """Rows and summary for every case of one published-runs file or several (default: the old
    and the modern file); each row's ``dataset`` names its file (DATASET_LABELS). ``hardware``
    (a calibrated profile) replaces the bundled profile of every case's GPU kind, ``stack``
    the stack every case names. ``progress(done, total)`` is called as the cases are predicted."""
    paths = [path] if isinstance(path, (str, Path)) else list(path or DEFAULT_FILES)
    files = [(Path(p), load_cases(p)) for p in paths]
    setups = [case_setups(cases, hardware, stack) for _, cases in files]
    origin = str(files[0][0]) if len(files) == 1 else f"the {len(files)} runs files"
    check_work([s for file in setups for s in file], origin)
    total = sum(len(cases) for _, cases in files)
    rows: tuple[ValidationRow, ...] = ()
    for (p, cases), file_setups in zip(files, setups):
        label = DATASET_LABELS.get(p.stem, p.stem)
        done = len(rows)
        report = (lambda n, done=done: progress(done + n, total)) if progress else None
        rows += validate_cases(cases, simulated, label, hardware, stack, report, file_setups)
    if progress:
        progress(total, total)
    return rows, summarize(rows)
