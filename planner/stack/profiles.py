"""Loading stacks: the bundled ones (profiles/stacks/*.json) by name, a user's file by path, and
overrides from flags or validation cases. Validation is strict, as for hardware profiles: an
unknown key (with the closest known one), a missing field, a value of the wrong kind or out of
range is one PlanInputError line naming the field.
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.core.schema import suggestion
from planner.core.units import DATA_DIR
import planner.stack.userbuffers as userbuffers
from planner.stack.components import load_component, with_components
from planner.stack.spec import OPTION_FIELDS, REQUIRED_FIELDS, Stack, check_value

STACKS_DIR = DATA_DIR / "stacks"
DEFAULT_STACK = "megatron-core"
# the stack each launcher runs: ``--launcher X`` prices plans on it unless --stack says otherwise
LAUNCHER_STACKS = {"megatron": "megatron-core", "deepspeed": "deepspeed",
                   "torchtitan": "torchtitan"}


def _unknown(key: str, known, origin: str, what: str) -> PlanInputError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; {what} are {', '.join(known)}"
    return PlanInputError(f"{origin}: unknown key '{key}'{hint}")


def stack_from_dict(data, origin: str, need_sources: bool = False) -> Stack:
    """A Stack from its JSON object; ``need_sources`` (bundled files) demands a source per field.

    A user's file either gives every field, or names a bundled stack as ``base`` and gives only
    what differs (plus name, version and description): every field is still stated somewhere,
    and such a file keeps working when a later release adds fields to the bundled stacks. It
    may also list ``components`` (profiles/components/) that run over its base: their fields
    are not repeated in the file, and a field both set is refused as a contradiction."""
    if not isinstance(data, dict):
        raise PlanInputError(f"{origin}: expected a JSON object describing the stack")
    allowed = REQUIRED_FIELDS + ("sources", "base", "components")
    for key in data:
        if key not in allowed:
            raise _unknown(key, allowed, origin, "stack fields")
    if "components" in data:
        return _with_file_components(data, origin, need_sources)
    if "base" in data:
        data = _on_base(data, origin)
    for key in REQUIRED_FIELDS:
        if key not in data:
            raise PlanInputError(f"{origin}: missing '{key}'; a stack file gives every field, or "
                                 "names a bundled stack as \"base\" and gives what differs "
                                 "(`plan stacks --json` prints the bundled ones)")
    values = {key: check_value(key, data[key], origin) for key in REQUIRED_FIELDS}
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise PlanInputError(f"{origin}: 'sources' must be an object of field: source text")
    for key, text in sources.items():
        if key not in OPTION_FIELDS:
            raise _unknown(key, OPTION_FIELDS, f"{origin}: sources", "option fields")
        if not isinstance(text, str) or not text.strip():
            raise PlanInputError(f"{origin}: sources '{key}' must be a non-empty string")
    if need_sources:
        for key in OPTION_FIELDS:
            if key not in sources:
                raise PlanInputError(f"{origin}: sources has no entry for '{key}'")
    return Stack(**values, sources=tuple((k, sources[k]) for k in OPTION_FIELDS if k in sources))


def _with_file_components(data: dict, origin: str, need_sources: bool) -> Stack:
    """A stack file's stack with the components it lists run over it (its base's name is what a
    component's ``over`` is checked against)."""
    names = data["components"]
    if "base" not in data:
        raise PlanInputError(f"{origin}: a stack file that lists 'components' names the bundled "
                             "stack they run over as \"base\"")
    rest = {k: v for k, v in data.items() if k != "components"}
    plain = stack_from_dict(rest, origin, need_sources)
    base = replace(plain, name=str(rest["base"]).lower().strip())  # what `over` names
    running = with_components(base, names, origin)  # the names checked here first
    for name in names:
        clash = sorted(set(rest) & set(dict(load_component(name).fields)))
        if clash:
            raise PlanInputError(f"{origin}: '{clash[0]}' is set both by the file and by "
                                 f"component {name}; drop one")
    return replace(running, name=plain.name)


def _on_base(data: dict, origin: str) -> dict:
    """The file's fields over its base's (a bundled stack's), sources likewise."""
    base = data["base"]
    if not isinstance(base, str) or base.lower().strip() not in bundled_names():
        raise PlanInputError(f"{origin}: 'base' must name a bundled stack "
                             f"({', '.join(bundled_names())}), got {base!r}")
    stack = _bundled(base.lower().strip())
    merged = {key: getattr(stack, key) for key in OPTION_FIELDS}
    merged.update({k: v for k, v in data.items() if k not in ("base", "sources")})
    own = data.get("sources", {})  # not an object: stack_from_dict refuses it
    merged["sources"] = {**dict(stack.sources), **own} if isinstance(own, dict) else own
    return merged


def load_stack_file(path: str | Path) -> Stack:
    data = read_json(path, "stack file", "`plan stacks` lists the bundled ones")
    return stack_from_dict(data, str(path))


@lru_cache(maxsize=None)
def _bundled(name: str) -> Stack:
    path = STACKS_DIR / f"{name}.json"
    return stack_from_dict(read_json(path, "stack file"), str(path), need_sources=True)


def bundled_names() -> tuple[str, ...]:
    """Bundled stacks, the default first."""
    names = sorted(p.stem for p in STACKS_DIR.glob("*.json"))
    return tuple(sorted(names, key=lambda n: n != DEFAULT_STACK))


def bundled_stacks() -> dict[str, Stack]:
    return {name: _bundled(name) for name in bundled_names()}


def default_stack() -> Stack:
    return _bundled(DEFAULT_STACK)


def load_stack(name_or_file: str | Path | None = None, launcher: str | None = None) -> Stack:
    """A bundled stack by name, a user's stack file by path, or (neither given) the launcher's
    stack, or the default."""
    if name_or_file is None:
        return _bundled(LAUNCHER_STACKS.get(launcher or "", DEFAULT_STACK))
    text = str(name_or_file)
    if text.endswith(".json") or "/" in text or Path(text).is_file():
        return load_stack_file(text)
    key = text.lower().strip()
    if key not in bundled_names():
        raise PlanInputError(f"unknown stack '{text}'{suggestion(key, bundled_names())}; "
                             f"choose one of {', '.join(bundled_names())}, or pass a stack JSON "
                             "file")
    return _bundled(key)


def with_overrides(stack: Stack, origin: str = "override", **changes) -> Stack:
    """The stack with some fields changed (flags, a validation case); each change is checked as
    a file value would be and recorded in ``overrides`` when it differs from the stack's."""
    if not changes:
        return stack
    done = dict(stack.overrides)
    values = {}
    for key, value in changes.items():
        if key not in OPTION_FIELDS:
            raise _unknown(key, OPTION_FIELDS, origin, "option fields")
        value = check_value(key, value, origin)
        if value != getattr(stack, key):
            values[key] = value
            done[key] = userbuffers.summary(value) if key == "tp_overlap_ub" else _text(value)
    if not values:
        return stack
    return replace(stack, **values, overrides=tuple(done.items()))


def _text(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def resolve_stack(name_or_file: str | Path | None = None, launcher: str | None = None,
                  flash: bool | None = None, overlap: bool | None = None,
                  tp_overlap: bool | None = None, grad_dtype: str | None = None,
                  precision: str | None = None) -> Stack:
    """The stack a command runs on: ``--stack`` (or the launcher's, or the default) with the
    direct flags applied as overrides (None: the stack's own value)."""
    stack = load_stack(name_or_file, launcher)
    changes = {}
    if flash is not None:
        changes["attention"] = "flash" if flash else "unfused"
    if overlap is not None:
        changes["overlap_grad_reduce"] = changes["overlap_param_gather"] = overlap
    if tp_overlap is not None:
        changes["tp_comm_overlap"] = tp_overlap
    if grad_dtype is not None:
        changes["grad_dtype"] = grad_dtype.lower()
    if precision is not None:
        changes["precision"] = precision.lower()
    origin = ("--grad-dtype" if grad_dtype is not None else
              "--precision" if precision is not None else "flags")
    return with_overrides(stack, origin, **changes)
