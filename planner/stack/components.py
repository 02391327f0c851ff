"""Named software components: a framework, an engine release or a recipe that a run used on top
of a bundled stack, as one named, versioned set of stack fields, each with its source.

A bundled stack (profiles/stacks/) prices one engine as its users run it today. A published run
often ran something else over it: llm-foundry over FSDP, torch 2.6's pipelining engine under
torchtitan, DeepSeek's framework priced on Megatron-Core. Such a difference is a component
(profiles/components/*.json), named and reviewable, instead of per-case overrides; a validation
case lists the components its source ran (``components``), and so may a user's stack file. What
one run alone chose (a launch flag) stays a case override, quoted in its provenance.

A component file: ``name``, ``version`` (what release or commit its sources describe),
``description``, ``over`` (the bundled stacks it runs over), ``fields`` (stack field: value) and
``sources`` (stack field: where the value comes from, quoted), one for every field.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from functools import lru_cache

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.core.schema import suggestion
from planner.core.units import DATA_DIR
from planner.stack.spec import OPTION_FIELDS, Stack, check_value

COMPONENTS_DIR = DATA_DIR / "components"
_KEYS = ("name", "version", "description", "over", "fields", "sources")


@dataclass(frozen=True)
class Component:
    """One named component: the stack fields it sets, each with its source."""

    name: str
    version: str
    description: str
    over: tuple[str, ...]  # the bundled stacks it runs over
    fields: tuple[tuple[str, object], ...]  # (stack field, checked value)
    sources: tuple[tuple[str, str], ...]  # (stack field, source), one per field

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def component_from_dict(data, origin: str) -> Component:
    """A Component from its JSON object, every key checked; one PlanInputError line otherwise."""
    if not isinstance(data, dict):
        raise PlanInputError(f"{origin}: expected a JSON object describing the component")
    for key in data:
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; keys are {', '.join(_KEYS)}"
            raise PlanInputError(f"{origin}: unknown key '{key}'{hint}")
    missing = [key for key in _KEYS if key not in data]
    if missing:
        raise PlanInputError(f"{origin}: missing {', '.join(repr(k) for k in missing)}")
    name, version, description = (check_value(key, data[key], origin)
                                  for key in ("name", "version", "description"))
    over = data["over"]
    if not isinstance(over, list) or not over or not all(isinstance(s, str) for s in over):
        raise PlanInputError(f"{origin}: 'over' must be a non-empty list of bundled stack names")
    fields, sources = data["fields"], data["sources"]
    if not isinstance(fields, dict) or not fields:
        raise PlanInputError(f"{origin}: 'fields' must be an object of stack field: value")
    if not isinstance(sources, dict):
        raise PlanInputError(f"{origin}: 'sources' must be an object of stack field: source")
    for key in fields:
        if key not in OPTION_FIELDS:
            raise PlanInputError(f"{origin}: fields: '{key}' is not a stack field"
                                 f"{suggestion(key, OPTION_FIELDS)}")
        text = sources.get(key)
        if not isinstance(text, str) or not text.strip():
            raise PlanInputError(f"{origin}: sources has no entry for '{key}'; every field a "
                                 "component sets says where its value comes from")
    extra = sorted(set(sources) - set(fields))
    if extra:
        raise PlanInputError(f"{origin}: sources names '{extra[0]}', which 'fields' does not set")
    checked = tuple((key, check_value(key, value, f"{origin}: fields"))
                    for key, value in fields.items())
    return Component(name=name, version=version, description=description, over=tuple(over),
                     fields=checked, sources=tuple((key, sources[key]) for key in fields))


def component_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in COMPONENTS_DIR.glob("*.json")))


@lru_cache(maxsize=None)
def load_component(name: str) -> Component:
    """A bundled component by name; an unknown name gets the closest one and the list."""
    if not isinstance(name, str) or name not in component_names():
        raise PlanInputError(f"unknown component {name!r}{suggestion(str(name), component_names())}"
                             f"; the components are {', '.join(component_names())}")
    path = COMPONENTS_DIR / f"{name}.json"
    component = component_from_dict(read_json(path, "component file"), str(path))
    if component.name != name:
        raise PlanInputError(f"{path}: 'name' is {component.name!r}, not its file's {name!r}")
    return component


def bundled_components() -> dict[str, Component]:
    return {name: load_component(name) for name in component_names()}


def with_components(stack: Stack, names, origin: str) -> Stack:
    """``stack`` running the named components: each sets its fields (and their sources) over
    the stack it names in ``over``. Two components that set one field differently contradict
    each other and are refused; so is a component over a stack it does not run on."""
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise PlanInputError(f"{origin}: 'components' must be a list of component names")
    if len(set(names)) != len(names):
        raise PlanInputError(f"{origin}: 'components' names one component twice")
    if not names:
        return stack
    values, sources, set_by, labels = {}, dict(stack.sources), {}, list(stack.components)
    for name in names:
        component = load_component(name)
        labels.append(component.label)
        if stack.name not in component.over:
            raise PlanInputError(f"{origin}: component {name} runs over "
                                 f"{', '.join(component.over)}, not the {stack.name} stack")
        for key, value in component.fields:
            if key in values and values[key] != value:
                raise PlanInputError(f"{origin}: components {set_by[key]} and {name} both set "
                                     f"'{key}', to different values; keep one")
            values[key], set_by[key] = value, name
        sources.update((key, f"{component.label}: {text}") for key, text in component.sources)
    return replace(stack, **values, sources=tuple(sources.items()), components=tuple(labels))
