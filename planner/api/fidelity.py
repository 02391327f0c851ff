"""Predictions against measured runs: `plan validate` and `plan calibrate`."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from planner.api.results import Validation
from planner.core import arguments as arg
from planner.core.errors import PlanInputError
from planner.fidelity.calibrate import Calibration, calibrate_to_runs, calibrated_profile
from planner.fidelity.calibrate import parse_factors as parse_factor_list
from planner.fidelity.cases import DEFAULT_FILES, load_cases
from planner.fidelity.holdout import SettingEffect, all_cases, held_out_file, setting_effects
from planner.fidelity.published import summarize, validate_file
from planner.hardware.profiles import Hardware
from planner.stack import Stack


def validate(file=None, progress=None) -> Validation:
    """Predict the bundled published runs (or those of ``file``) and compare (`plan validate`):
    a Validation. ``file`` is checked first (PlanInputError)."""
    arg.callback("progress", progress)
    if file is not None and not isinstance(file, (str, Path)):
        files = file if isinstance(file, (list, tuple)) else None
        if not files or not all(isinstance(f, (str, Path)) for f in files):
            # {} or [] is falsy: it validated the bundled runs without a word
            raise PlanInputError(f"file must be a runs-file path or a non-empty list of them, "
                                 f"got {file!r:.60}")
    return validate_runs(file, progress=progress)


def validate_runs(files=None, *, hardware: Hardware | None = None, stack: Stack | None = None,
                  progress=None) -> Validation:
    """Each run of ``files`` (a runs-file path or several; default the bundled ones) predicted
    on ``hardware`` and ``stack`` where given (else each run's own) and compared: a Validation
    (rows and summary). No argument checks beyond the files' own: `plan validate` parses them."""
    files = DEFAULT_FILES if files is None else files
    rows, summary = validate_file(files, hardware=hardware, stack=stack, progress=progress)
    if stack is not None:  # one stack for every case: nothing of a source's own to hold out
        return Validation(rows, summary)
    held = held_out_file(rows, files, hardware)
    return Validation(rows, summarize(rows, held), held)


def single_source_settings(files=None, progress=None) -> tuple[SettingEffect, ...]:
    """Each stack setting that the runs of only one source set (a component it ran, a launch
    flag, its configuration), priced with and without on those runs (`plan validate
    --settings`)."""
    files = DEFAULT_FILES if files is None else files
    rows, _ = validate_file(files)
    return setting_effects(all_cases(files), rows, progress)


def parse_factors(text: str) -> tuple[str, ...]:
    """The efficiency factors named by a comma list (``--factors``); PlanInputError when one is
    unknown or none is named."""
    return parse_factor_list(text)


def calibrate(runs: str | Path, factors: Sequence[str], progress=None) -> Calibration:
    """The ``factors`` fitted to the measured runs of the file ``runs`` (least squares on log
    step-time error), with the leave-one-out error before and after."""
    return calibrate_to_runs(load_cases(runs), factors, progress)


def calibrated_hardware(cal: Calibration, source: str) -> dict:
    """The GPU profile with ``cal``'s factors applied, as the JSON document ``--hardware``
    reads; ``source`` names the runs file it was fitted to."""
    return calibrated_profile(cal, source)
