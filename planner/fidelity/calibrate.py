"""Fit a GPU profile's efficiency factors to the user's own measured runs: ``plan calibrate``.

The cost model prices each operation from a few achieved-rate factors of the hardware profile
(``matmul_efficiency``, ``attention_efficiency``, ``network_efficiency``), each defaulting to a
published measurement (planner/cost/constants.py). On a user's own cluster and software these
rates differ; runs measured there pin them down. The fit:

- minimises the sum of squared log errors, ``log(predicted / measured)`` per run, so a run twice
  too slow and one twice too fast weigh the same, whatever their step times;
- over at most three named factors, each a multiplier on the profile's value (capped at 1, a
  rate cannot beat the peak), by Levenberg-Marquardt with a forward-difference Jacobian;
- leaves a factor at its profile value when no run's step time depends on it (say, the network
  factor from single-node runs) and says so;
- reports the leave-one-out error (fit on all runs but one, predict that one), the honest measure
  of what the calibration buys on a run it has not seen: refitted on the others up to
  EXACT_LOO_RUNS runs, by one Gauss-Newton step from the fit on all beyond (linear in the
  runs); at most MAX_CALIBRATION_RUNS runs.

Runs are priced with the closed-form pipeline (no op-by-op simulation): the fit evaluates every
run dozens of times, and the factors scale compute and communication times, which the closed form
and the simulation share.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

import numpy as np

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.cost import constants
from planner.fidelity.case_cluster import base_profile
from planner.fidelity.cases import case_setup
from planner.fidelity.published import validate_case
from planner.fidelity.work import CALIBRATION_PRICINGS, check_work
from planner.hardware.profiles import HARDWARE_DIR, Hardware, load_hardware

# factor name (as the user types it) -> the hardware profile field it multiplies, and its default
FACTORS = {
    "matmul": ("matmul_efficiency", constants.MATMUL_EFFICIENCY),
    "attention": ("attention_efficiency", constants.ATTENTION_EFFICIENCY),
    "network": ("network_efficiency", constants.NETWORK_EFFICIENCY),
}
# A factor whose multiplier moves no run's log step time by at least this much per unit of log
# multiplier is not identified by the runs (numerical noise of the closed form is ~1e-12).
IDENTIFIABLE = 1e-4
_STEP = 1e-4  # forward-difference step, in log multiplier
# Runs one calibration fits. Each fit prices every run a few dozen times (~1 ms a run on a
# 2-core CPU), so 64 runs fit in seconds; no GPU kind in the bundled runs has more than 41, and a
# calibration needs a handful (issue #31: 20 runs took 46 s when every run was refitted).
MAX_CALIBRATION_RUNS = 64
# Up to this many runs the leave-one-out refits the factors on the others, warm-started from
# the fit on all (each refit prices the other runs: quadratic, ~5 s of CPU at 16 runs and 3
# factors); beyond it a Gauss-Newton step from the fit on all stands for each refit (_without),
# linear in the runs. With few runs per factor the step is no refit: on 4 to 6 runs and three
# factors it missed the refit by 0.3 to 90 points of error.
EXACT_LOO_RUNS = 16
# A better trial that lowers the sum of squared log errors by less than this fraction of itself
# ends the fit: the errors are reported to 0.1%, far above what such a step moves.
_RTOL = 1e-10
# A run this many times slower or faster than its uncalibrated prediction is refused before the
# fit: factors are efficiencies (at most 1) and the bundled runs are predicted within about +-30%,
# so a 100x gap is a unit slip (milliseconds as seconds) or another configuration, not a rate.
MAX_RUN_GAP = 100.0
# The log multipliers the fit may try, +-ln(10^6): a rate moved a million-fold is no
# calibration, and Levenberg-Marquardt's trial steps past it overflowed exp() (a run's step
# time of 1e-300 s). Fits that matter end within a few units of 0.
_MAX_LOG_MULT = math.log(1e6)


@dataclass(frozen=True)
class Calibration:
    """What ``plan calibrate`` found. Errors are signed fractions, predicted / measured - 1."""

    profile: Hardware  # the bundled profile the runs' GPU kind maps to, before fitting
    fitted: Hardware  # the same profile with the fitted factors
    factors: tuple[str, ...]  # the factors asked for
    not_identified: tuple[str, ...]  # of those, the ones no run depends on (left as they were)
    runs: tuple[str, ...]
    skipped: tuple[str, ...]  # runs the planner cannot evaluate (with the reason)
    errors_before: tuple[float, ...]
    errors_after: tuple[float, ...]  # in-sample, with the factors fitted on all runs
    loo_errors_after: tuple[float, ...]  # each run predicted by a fit on the others

    def value(self, hw: Hardware, factor: str) -> float:
        field, default = FACTORS[factor]
        return getattr(hw, field) or default

    @property
    def loo_before(self) -> float:
        """Mean |error| before fitting (nothing is fitted, so in- and out-of-sample agree)."""
        return _mean_abs(self.errors_before)

    @property
    def loo_after(self) -> float:
        return _mean_abs(self.loo_errors_after)


def _mean_abs(errors: Sequence[float]) -> float:
    return sum(abs(e) for e in errors) / len(errors)


def parse_factors(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in FACTORS]
    if unknown or not names:
        raise PlanInputError(f"--factors takes a comma list of {', '.join(FACTORS)}; "
                             f"got {text!r}")
    return names


def _with(hw: Hardware, factors: Sequence[str], log_mult: np.ndarray) -> Hardware:
    """``hw`` with each factor's value times exp(log multiplier), capped at 1."""
    values = {}
    for name, x in zip(factors, log_mult):
        field, default = FACTORS[name]
        x = min(max(float(x), -_MAX_LOG_MULT), _MAX_LOG_MULT)
        values[field] = min(1.0, (getattr(hw, field) or default) * math.exp(x))
    return replace(hw, **values)


def _residuals(cases: Sequence[dict], base: Hardware, factors: Sequence[str]
               ) -> Callable[[np.ndarray], np.ndarray]:
    measured = np.array([float(c["measured"]["step_time_s"]) for c in cases])

    def residuals(log_mult: np.ndarray) -> np.ndarray:
        hw = _with(base, factors, log_mult)
        predicted = np.array([validate_case(c, simulated=False, hardware=hw).predicted_step_s
                              for c in cases])
        return np.log(predicted / measured)

    return residuals


def _fit(residuals: Callable[[np.ndarray], np.ndarray], k: int, iterations: int = 40,
         start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on log multipliers from ``start`` (0: the profile's values); returns
    (log multipliers, identified mask). Stops when a step would move no multiplier by 1e-7 in
    log (before pricing it), when the damping grows past 1e8 without a better trial, or when a
    better trial lowers the sum of squares by less than _RTOL of itself: each of the runs is
    priced once per trial, so the trials are the cost."""
    x = np.zeros(k) if start is None else np.array(start, dtype=float)
    r = residuals(x)
    identified = np.ones(k, dtype=bool)
    lam = 1e-3
    for it in range(iterations):
        jac = np.column_stack([(residuals(x + _STEP * np.eye(k)[j]) - r) / _STEP
                               for j in range(k)])
        if it == 0:
            identified = np.abs(jac).max(axis=0) >= IDENTIFIABLE
        jac[:, ~identified] = 0.0
        a, g = jac.T @ jac, jac.T @ r
        improved = converged = False
        while lam < 1e8:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12) + np.diag(~identified * 1.0),
                                   -g)
            if np.abs(step).max() < 1e-7:
                converged = True
                break
            trial = residuals(x + step)
            if trial @ trial < r @ r:
                converged = r @ r - trial @ trial <= _RTOL * (r @ r)
                x, r, lam, improved = x + step, trial, max(lam / 3, 1e-9), True
                break
            lam *= 4
        if not improved or converged:
            break
    return x, identified


def _jacobian(residuals: Callable[[np.ndarray], np.ndarray], x: np.ndarray, r: np.ndarray
              ) -> np.ndarray:
    """Forward differences of the residuals in each log multiplier at ``x`` (r = residuals(x))."""
    k = len(x)
    return np.column_stack([(residuals(x + _STEP * np.eye(k)[j]) - r) / _STEP for j in range(k)])


def _without(x: np.ndarray, jac: np.ndarray, r: np.ndarray, depends: np.ndarray, i: int
             ) -> np.ndarray:
    """The fit on every run but run ``i``, from the fit on all: x, with the residuals r and the
    Jacobian jac there, and depends[run, factor] (the factor moves the run). One Gauss-Newton
    step on the other runs' linearised residuals, which for a model linear in its parameters is
    the refit itself (the PRESS residual of linear least squares, Allen 1974, Technometrics
    16(1)); log step time is nearly linear in the log multipliers, and on the bundled families
    of 10 and 24 runs it agrees with refitting within 0.01 points of error. A factor no other
    run depends on goes back to the profile's value (0), where a refit would leave it. It
    prices nothing: the leave-one-out is linear in the runs."""
    keep = np.arange(len(r)) != i
    known = depends[keep].any(axis=0)
    out = np.where(known, x, 0.0)
    if known.any():
        step, *_ = np.linalg.lstsq(jac[keep][:, known], -r[keep], rcond=None)
        out[known] += step
    return out


def calibrate_to_runs(cases: Sequence[dict], factors: Sequence[str] = tuple(FACTORS),
              progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Fit ``factors`` of the runs' GPU profile to their measured step times."""
    factors = tuple(factors)
    if len(cases) > MAX_CALIBRATION_RUNS:
        raise PlanInputError(f"plan calibrate fits at most {MAX_CALIBRATION_RUNS} runs, got "
                             f"{len(cases)}; calibrate on a subset (the runs nearest the plans "
                             "you will make)")
    usable, skipped = [], []
    setups = [case_setup(case) for case in cases]
    check_work(setups, f"plan calibrate ({len(cases)} runs, each priced up to "
                       f"{CALIBRATION_PRICINGS} times)", simulated=False,
               pricings=CALIBRATION_PRICINGS)
    for case, setup in zip(cases, setups):
        if setup.unsupported:
            skipped.append(f"{setup.name}: {setup.unsupported}")
        else:
            usable.append(case)
    if len(usable) < len(factors):
        raise PlanInputError(
            f"calibrating {len(factors)} factor(s) ({', '.join(factors)}) needs at least "
            f"{len(factors)} runs the planner can evaluate; got {len(usable)}. Measure more runs "
            "or pass fewer --factors")
    profiles = sorted({base_profile(str(c["cluster"].get("gpu", ""))) for c in usable})
    if len(profiles) > 1:
        raise PlanInputError(f"the runs are on several GPU kinds ({', '.join(profiles)}); "
                             "calibrate one kind at a time (one runs file per GPU)")
    base = load_hardware(profiles[0])
    residuals = _residuals(usable, base, factors)
    before = residuals(np.zeros(len(factors)))
    _refuse_far_runs(usable, before)
    total = len(usable) + 1
    x, identified = _fit(residuals, len(factors))
    if progress:
        progress(1, total)
    after = residuals(x)
    jac = depends = None
    if len(usable) > EXACT_LOO_RUNS:
        jac = _jacobian(residuals, x, after)
        # which runs each factor moves, at the profile's values (as _fit finds it identified)
        depends = (np.abs(_jacobian(residuals, np.zeros(len(factors)), before)) >= IDENTIFIABLE
                   ) & identified
    loo = []
    for i, case in enumerate(usable):
        if len(usable) <= EXACT_LOO_RUNS:
            others = usable[:i] + usable[i + 1:]
            xi, _ = _fit(_residuals(others, base, factors), len(factors), start=x)
        else:
            xi = _without(x, jac, after, depends, i)
        loo.append(_residuals([case], base, factors)(xi)[0])
        if progress:
            progress(i + 2, total)
    return Calibration(
        profile=base, fitted=_with(base, factors, x), factors=factors,
        not_identified=tuple(f for f, ok in zip(factors, identified) if not ok),
        runs=tuple(c["name"] for c in usable), skipped=tuple(skipped),
        errors_before=tuple(math.expm1(e) for e in before),
        errors_after=tuple(math.expm1(e) for e in after),
        loo_errors_after=tuple(math.expm1(e) for e in loo))


def _refuse_far_runs(cases: Sequence[dict], log_errors: np.ndarray) -> None:
    """One line naming the first run more than MAX_RUN_GAP times off its prediction."""
    for case, e in zip(cases, log_errors):
        if not abs(e) <= math.log(MAX_RUN_GAP):  # also NaN
            e = min(max(float(e), -700.0), 700.0)  # exp() of it stays a float
            measured = float(case["measured"]["step_time_s"])
            raise PlanInputError(
                f"run '{case['name']}': measured step_time_s {measured:.3g} s, predicted "
                f"{measured * math.exp(e):.3g} s: {math.exp(abs(e)):.3g}x apart, more than "
                f"{MAX_RUN_GAP:g}x; check it is seconds per step of this configuration, or "
                "leave the run out")


def calibrated_profile(cal: Calibration, source: str) -> dict:
    """The fitted profile as a hardware JSON for ``--hardware``: every field of the base profile,
    the fitted factors, and in ``sources`` what each fitted value rests on."""
    hw = cal.fitted
    doc = {k: v for k, v in asdict(hw).items() if v is not None}
    doc["name"] = f"{cal.profile.name}-calibrated"
    base_sources = _bundled_sources(cal.profile.name)
    sources = dict(base_sources)
    runs = ", ".join(cal.runs)
    for name in cal.factors:
        field, _ = FACTORS[name]
        if name in cal.not_identified:
            sources[field] = (base_sources.get(field, "default") + f" (plan calibrate: no run in "
                              f"{source} depends on it, left as it was)")
            continue
        sources[field] = (
            f"plan calibrate on {len(cal.runs)} runs of {source} ({runs}): least squares on log "
            f"step-time error, {cal.value(cal.profile, name):.4g} -> {cal.value(hw, name):.4g}; "
            f"leave-one-out mean |error| {cal.loo_before:.1%} -> {cal.loo_after:.1%}")
    doc["sources"] = sources
    return doc


def _bundled_sources(name: str) -> dict:
    path = HARDWARE_DIR / f"{name}.json"
    return dict(read_json(path, "hardware file").get("sources", {})) if path.exists() else {}
