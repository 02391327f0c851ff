"""Held-out fidelity: each source's runs priced as if the source had never been seen, and what
the settings only one source turns on are worth.

Leave one source out. The cost model has no parameter fitted over the validation set as a whole;
what was chosen from end-to-end rows is listed, with its source, in planner/fidelity/sources.py
(ROW_CHOSEN). Holding a source out re-prices its runs with each of those values at what is known
without the source (``RowChosen.held_out``); every other source's runs are priced as in-sample,
since nothing chosen from the held-out rows reaches them (a value chosen from rows is priced only
for the runs of the software it was measured on). So the held-out error of a group differs from
its in-sample error exactly by what its own rows chose.

Settings of one source. A stack field at a value that only one source's runs set, through a
component it ran or a launch flag it quotes (a case's ``stack_overrides``, or its ``config``), is
evidence of that source alone. Each is priced away (the field at its bundled stack's value) on
that source's runs, and the mean error with and without it is reported.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.fidelity.cases import DEFAULT_FILES, load_cases
from planner.fidelity.published import ValidationRow, validate_case
from planner.fidelity.sources import RowChosen, row_chosen, source_of
from planner.stack import load_component, load_stack


def _applies(chosen: RowChosen, case: dict) -> bool:
    if chosen.origin == "component":
        return chosen.name in (case.get("components") or [])
    if chosen.origin == "stack":
        return case.get("stack") == chosen.name
    return (case.get("config") or {}).get(chosen.name) is not None


def held_out_case(case: dict) -> dict | None:
    """The case with every value chosen from its own source's rows at its held-out value; None
    when its source chose none that it uses."""
    chosen = [c for c in row_chosen(source_of(case.get("group", ""))) if _applies(c, case)]
    if not chosen:
        return None
    out = copy.deepcopy(case)
    for c in chosen:
        if c.origin == "config":
            out["config"][c.name] = c.held_out
        else:
            out.setdefault("stack_overrides", {})[c.field] = c.held_out
    return out


def held_out_rows(cases: list[dict], rows: tuple[ValidationRow, ...],
                  hardware=None) -> tuple[ValidationRow, ...]:
    """``rows`` (the in-sample rows of ``cases``, in order) with each case whose source chose a
    value it uses re-priced with that value held out."""
    out = []
    for case, row in zip(cases, rows, strict=True):
        held = held_out_case(case)
        out.append(row if held is None or not row.supported
                   else validate_case(held, dataset=row.dataset, hardware=hardware))
    return tuple(out)


def held_out_file(rows: tuple[ValidationRow, ...], path=DEFAULT_FILES,
                  hardware=None) -> tuple[ValidationRow, ...]:
    """:func:`held_out_rows` for the rows validate_file gave for ``path`` (one file or
    several)."""
    return held_out_rows(all_cases(path), rows, hardware)


def all_cases(path=DEFAULT_FILES) -> list[dict]:
    paths = [path] if isinstance(path, (str, Path)) else list(path or DEFAULT_FILES)
    return [case for p in paths for case in load_cases(p)]


# --- settings only one source turns on ---------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """A stack field at a value set by the runs of one source only."""

    field: str
    value: object
    set_by: str  # "component NAME", "launch flag" (stack_overrides) or "config"
    source: str


@dataclass(frozen=True)
class SettingEffect:
    setting: Setting
    cases: tuple[str, ...]  # the runs that set it
    with_errors: tuple[float, ...]  # signed step-time errors as priced
    without_errors: tuple[float | None, ...]  # with the field at its stack's value (None: refused)


@lru_cache(maxsize=None)
def _component_fields(name: str) -> tuple[tuple[str, object], ...]:
    return load_component(name).fields


def _settings_of(case: dict) -> list[tuple[str, object, str]]:
    """(field, value, set_by) for what the case's components, launch flags and configuration
    set on its stack."""
    found = [(f, v, f"component {c}") for c in case.get("components") or []
             for f, v in _component_fields(c)]
    found += [(f, v, "launch flag") for f, v in (case.get("stack_overrides") or {}).items()]
    if (case.get("config") or {}).get("expert_load") is not None:
        found.append(("moe_expert_load", case["config"]["expert_load"], "config"))
    return found


def single_source_settings(cases: list[dict]) -> tuple[tuple[Setting, tuple[dict, ...]], ...]:
    """Each setting that the runs of exactly one source set, with those runs."""
    # values may be lists or dicts (unhashable): a setting is keyed by its value's repr
    sources: dict[tuple[str, str], set[str]] = {}
    runs: dict[tuple[str, str, str], tuple[object, list[dict]]] = {}
    for case in cases:
        src = source_of(case.get("group", ""))
        for field, value, set_by in _settings_of(case):
            sources.setdefault((field, repr(value)), set()).add(src)
            runs.setdefault((field, repr(value), set_by), (value, []))[1].append(case)
    out = []
    for (field, key, set_by), (value, found) in runs.items():
        owners = sources[(field, key)]
        if len(owners) == 1:
            out.append((Setting(field, value, set_by, next(iter(owners))), tuple(found)))
    return tuple(sorted(out, key=lambda s: (s[0].source, s[0].set_by, s[0].field)))


def _without(case: dict, setting: Setting) -> dict:
    """The case with ``setting``'s field at its bundled stack's value."""
    out = copy.deepcopy(case)
    if setting.set_by == "config":
        out["config"].pop("expert_load", None)
    else:
        out.setdefault("stack_overrides", {})[setting.field] = getattr(
            load_stack(case["stack"]), setting.field)
    return out


def setting_effects(cases: list[dict], rows: tuple[ValidationRow, ...], progress=None) -> tuple[SettingEffect, ...]:
    """Every single-source setting priced with and without on the runs that set it."""
    by_name = {r.case: r for r in rows}
    effects = []
    found = single_source_settings(cases)
    for n, (setting, runs) in enumerate(found):
        if progress:
            progress(n, len(found))
        priced = [(c, by_name[c["name"]]) for c in runs if by_name[c["name"]].supported]
        without = []
        for case, row in priced:
            try:
                alt = validate_case(_without(case, setting), dataset=row.dataset)
                without.append(alt.time_error)
            except PlanInputError:  # the run cannot be priced without it (say, its schedule)
                without.append(None)
        effects.append(SettingEffect(setting, tuple(c["name"] for c, _ in priced),
                                     tuple(r.time_error for _, r in priced), tuple(without)))
    return tuple(effects)
