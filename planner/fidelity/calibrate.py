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
  of what the calibration buys on a run it has not seen.

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


def _fit(residuals: Callable[[np.ndarray], np.ndarray], k: int, iterations: int = 40
         ) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on log multipliers from 0; returns (log multipliers, identified mask)."""
    x = np.zeros(k)
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
        improved = False
        while lam < 1e8:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12) + np.diag(~identified * 1.0),
                                   -g)
            trial = residuals(x + step)
            if trial @ trial < r @ r:
                x, r, lam, improved = x + step, trial, max(lam / 3, 1e-9), True
                break
            lam *= 4
        if not improved or np.abs(step).max() < 1e-7:
            break
    return x, identified


def calibrate_to_runs(cases: Sequence[dict], factors: Sequence[str] = tuple(FACTORS),
              progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Fit ``factors`` of the runs' GPU profile to their measured step times."""
    factors = tuple(factors)
    usable, skipped = [], []
    for case in cases:
        setup = case_setup(case)
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
    before = _residuals(usable, base, factors)(np.zeros(len(factors)))
    _refuse_far_runs(usable, before)
    total = len(usable) + 1
    x, identified = _fit(_residuals(usable, base, factors), len(factors))
    if progress:
        progress(1, total)
    loo = []
    for i in range(len(usable)):
        others = usable[:i] + usable[i + 1:]
        xi, _ = _fit(_residuals(others, base, factors), len(factors))
        loo.append(_residuals([usable[i]], base, factors)(xi)[0])
        if progress:
            progress(i + 2, total)
    after = _residuals(usable, base, factors)(x)
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
