"""What the planner knows: the model presets, the bundled stacks and components, the bundled GPU
profiles (`plan models`, `plan stacks`, `plan hardware`), and a model, GPU or stack by name."""

from __future__ import annotations

from pathlib import Path

from planner.hardware.profiles import Hardware, bundled_hardware, bundled_sources, load_hardware
from planner.model.load import load_model, presets
from planner.model.spec import ModelSpec
from planner.model.spec import sequence_note as note_on_sequence
from planner.model.template import model_template as template_of
from planner.stack import Component, Stack, bundled_components, bundled_stacks, resolve_stack


def models() -> dict[str, ModelSpec]:
    """Every model preset by name, dense then mixture-of-experts."""
    return presets()


def model(source: str | Path | None = None) -> ModelSpec:
    """A preset by name, or a model.json or HuggingFace config.json file (None: the default
    preset); PlanInputError naming the presets on a typo or a bad file."""
    return load_model(source)


def sequence_note(spec: ModelSpec, seq_len: int | None) -> str | None:
    """One line when ``spec`` is planned at a context other than the one it declares (an
    imported config's capped default, or the ``seq_len`` override); None otherwise."""
    return note_on_sequence(spec, seq_len)


def model_template(spec: ModelSpec) -> dict:
    """``spec`` as a model.json document: every field with its value."""
    return template_of(spec)


def stacks() -> dict[str, Stack]:
    """Every bundled software stack by name."""
    return bundled_stacks()


def components() -> dict[str, Component]:
    """Every bundled named component (what a stack file's "components" names) by name."""
    return bundled_components()


def hardware_profiles() -> dict[str, Hardware]:
    """Every bundled GPU profile by name."""
    return bundled_hardware()


def hardware_sources() -> dict[str, dict]:
    """Each bundled GPU profile's sources by name: where every figure comes from."""
    return bundled_sources()


def hardware(gpu: str | None = None, file: str | Path | None = None) -> Hardware:
    """A bundled GPU by name or alias (None: the default GPU), or the hardware JSON ``file``."""
    return load_hardware(gpu, file)


def stack(name: str | Path | None = None, launcher: str | None = None,
          flash: bool | None = None, overlap: bool | None = None,
          tp_overlap: bool | None = None, grad_dtype: str | None = None,
          precision: str | None = None) -> Stack:
    """A bundled stack by name or a stack file (None: ``launcher``'s, else megatron-core), with
    the fields given (not None) overridden, as `--stack` and its override flags resolve it."""
    return resolve_stack(name, launcher, flash, overlap, tp_overlap, grad_dtype, precision)
