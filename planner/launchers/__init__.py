"""Exports of a plan for the launchers people use: plan.json, Megatron-LM, DeepSpeed, torchtitan,
torchrun + Slurm.

Each exporter module has ``render(plan) -> {filename: text}``, ``check(plan) -> [violation]`` and
``parallel_rules(Facts) -> [violation]``. :func:`export_plan` checks every target first
and writes nothing when any rule is broken; the files are written as one all-or-nothing set under
a directory lock, with a manifest of their digests written last (core/fileset.py), and never over
an existing file unless ``force``.
:func:`launcher_allows` is the cheap per-candidate test the search uses for ``--launcher``.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from planner.core.errors import PlanInputError
from planner.core.fileset import OutFile, write_set
from planner.launchers import deepspeed, megatron, plan_json, torchrun, torchtitan
from planner.launchers.common import ExportError, Facts, plan_digest
from planner.launchers.conflicts import (expert_load_refusal, explain_refusal, output_refusal,
                                         runs_on_stack, stack_refusal)
from planner.launchers.megatron import parse_megatron_args
from planner.model.spec import ModelSpec
from planner.predict.plan import Plan

plan_document = plan_json.document  # the plan.json v2 document: export and `solve --json` alike

EXPORTERS: dict[str, ModuleType] = {
    "json": plan_json,
    "megatron": megatron,
    "deepspeed": deepspeed,
    "torchtitan": torchtitan,
    "torchrun": torchrun,
}
LAUNCHERS = ("megatron", "deepspeed", "torchtitan")

__all__ = ["EXPORTERS", "LAUNCHERS", "ExportError", "Facts", "expert_load_refusal",
           "explain_refusal", "export_plan", "implied_launcher", "launcher_allows",
           "model_problems", "output_refusal", "parse_megatron_args", "parse_targets",
           "plan_document", "precision_allows", "refuse_unbuildable", "render_all",
           "runs_on_stack", "stack_refusal"]


def _exporter(target: str) -> ModuleType:
    try:
        return EXPORTERS[target]
    except KeyError:
        raise PlanInputError(f"unknown export target '{target}'; choose from "
                             f"{', '.join(EXPORTERS)}") from None


def launcher_allows(launcher: str, facts: Facts) -> str | None:
    """None when ``launcher`` can run this configuration, else the first rule it breaks."""
    problems = _exporter(launcher).parallel_rules(facts)
    return problems[0] if problems else None


def model_problems(launcher: str | None, model: ModelSpec) -> list[str]:
    """The rules of ``launcher`` on the model alone (torchtitan builds only its own flavors).
    A solve for that launcher checks them before it searches: no configuration can pass them,
    so refusing up front beats picking a plan and refusing its export."""
    rules = getattr(EXPORTERS.get(launcher or ""), "model_rules", None)
    return rules(model) if rules else []


def refuse_unbuildable(launcher: str | None, model: ModelSpec) -> None:
    """Raise ExportError (one line) when ``launcher`` cannot build ``model`` at all."""
    problems = model_problems(launcher, model)
    if problems:
        raise ExportError(f"{problems[0]}; choose a model {launcher} builds or another "
                          "--launcher")


def precision_allows(launcher: str | None, model, stack) -> str | None:
    """None when ``launcher`` runs the stack's precision (and FP8 recipe) for this model, else
    the rule it breaks: checked before a search, since no configuration changes it."""
    if launcher is None:
        return None
    problems = _exporter(launcher).precision_rules(model, stack)
    return problems[0] if problems else None


def implied_launcher(launcher: str | None, targets: list[str]) -> str | None:
    """The launcher a search must respect so that its best plan can be exported to
    ``targets``: the given one, or the one launcher among the targets (its rules and its
    stack). Two launchers at once cannot both run one plan as priced: refused before the
    search, so no export is left half written."""
    wanted = [t for t in dict.fromkeys(targets) if t in LAUNCHERS]
    if launcher is not None:
        others = [t for t in wanted if t != launcher]
        if others:
            raise PlanInputError(f"--export {others[0]} with --launcher {launcher}: a plan is "
                                 f"priced on one launcher's stack; export {others[0]} from a "
                                 f"solve with --launcher {others[0]}")
        return launcher
    if len(wanted) > 1:
        raise PlanInputError(f"--export {', '.join(wanted)}: a plan is priced on one launcher's "
                             "stack; export one launcher per solve (json and torchrun go with "
                             "any)")
    return wanted[0] if wanted else None


def stack_problems(plan: Plan, target: str) -> list[str]:
    """A launcher export of a plan priced on another launcher's stack would not run what was
    priced: refused, with the stack to solve on instead."""
    stack = plan.stack
    if target not in LAUNCHERS or stack is None or runs_on_stack(stack, target):
        return []
    return [f"the plan was priced on the {stack.name} stack, which runs on "
            f"{stack.launcher or 'no bundled launcher'}, not {target}; solve again with "
            f"--launcher {target} (or --stack with a {target} stack) and export that plan"]


def render_all(plan: Plan, targets: list[str]) -> dict[str, str]:
    """Check every target, then render: {filename: text}. Raises ExportError on a broken rule."""
    targets = list(dict.fromkeys(targets))
    for target in targets:
        _exporter(target)
    clash = torchrun.conflicts(targets)
    if clash:
        raise ExportError(f"cannot export for torchrun: {clash}")
    files: dict[str, str] = {}
    for target in targets:
        module = _exporter(target)
        problems = stack_problems(plan, target) + module.check(plan)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ExportError(f"cannot export for {target}: {problems[0]}{more}")
        files.update(module.render(plan))
    return files


def parse_targets(text: str | None) -> list[str]:
    """``--export`` as a list of known targets, checked before any search runs."""
    if text is None:
        return []
    targets = [t.strip() for t in text.split(",") if t.strip()]
    if not targets:
        raise PlanInputError(f"--export names no target (got {text!r}); give one or more of "
                             f"{', '.join(EXPORTERS)}, separated by commas")
    for target in targets:
        _exporter(target)
    return list(dict.fromkeys(targets))


def export_plan(plan: Plan, targets: list[str], out_dir: str | Path,
                force: bool = False) -> list[Path]:
    """Write the files of every target into ``out_dir`` as one set, all or nothing, one writer
    at a time (core/fileset.py); returns their paths in write order."""
    files = render_all(plan, targets)
    return write_set(out_dir, [OutFile(name, text, Path(name).suffix in (".sh", ".sbatch"))
                               for name, text in files.items()],
                     force=force, tag=plan_digest(plan))
