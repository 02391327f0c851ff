"""Solve inputs that contradict each other, refused before the search (issue #31): a flag that
would be ignored, or a stack and a launcher that cannot go together. A search takes seconds to
minutes; finding out after it that nothing was written, or that the export is refused, wastes
them and, worse, can pass unnoticed (exit 0). Each function returns the one-line refusal (what
is wrong, what to do) or None; the CLI and planner.api raise it as a PlanInputError.
"""

from __future__ import annotations

from planner.stack import LAUNCHER_STACKS, Stack


def runs_on_stack(stack: Stack, launcher: str | None) -> bool:
    """Whether ``launcher`` runs a plan priced on ``stack`` as priced: the stack names that
    launcher. No launcher (a plain solve, or json and torchrun, which go with any) asks
    nothing of the stack. The one rule of stack against launcher: the search and the export
    both ask it."""
    return launcher is None or stack.launcher == launcher


def stack_refusal(stack: Stack, launcher: str | None, asked: str | None = None) -> str | None:
    """Why a solve for ``launcher`` (``asked``: the flag that chose it, ``--launcher X`` or
    ``--export X``) cannot be priced on ``stack``: its plans could be launched by no one as
    priced, and their export would be refused after the search. An unknown launcher is named
    as one (not as an "unknown export target", what its first rule lookup would say)."""
    if launcher is not None and launcher not in LAUNCHER_STACKS:
        return f"--launcher must be one of {', '.join(LAUNCHER_STACKS)}, got {launcher!r}"
    if runs_on_stack(stack, launcher):
        return None
    asked = asked or f"--launcher {launcher}"
    own = LAUNCHER_STACKS[launcher]
    if stack.launcher is None:  # a user's stack that names no launcher
        return (f"{asked} with --stack {stack.name}: that stack names no launcher, so "
                f"{launcher} would not run its plans as priced; set \"launcher\": "
                f"\"{launcher}\" in the stack file, or drop --stack")
    return (f"{asked} with --stack {stack.name}: that stack runs on {stack.launcher}, not "
            f"{launcher}, so {launcher} would not run its plans as priced; drop --stack "
            f"({launcher} plans on {own}) or plan for {stack.launcher}")


def output_refusal(*, explain: bool = False, targets=(), out_dir=None, csv_file=None,
                   force: bool = False, as_json: bool = False, wide: bool = False,
                   report_file=None) -> str | None:
    """Output flags of `plan solve` that would do nothing. --explain prints one pinned
    configuration and returns: it writes no export and no CSV (drop --explain: the search
    keeps the pins, so with every dimension pinned it finds that plan, and exports it)."""
    if explain:
        given = [flag for flag, on in (("--export", bool(targets)), ("--csv", csv_file is not None),
                                       ("--out", out_dir is not None),
                                       ("--report", report_file is not None)) if on]
        if given:
            return (f"--explain with {' and '.join(given)}: --explain prices one pinned plan and "
                    "writes no file; drop --explain to search and write them (the pins still hold)")
    if targets and out_dir is None:
        return "--export needs --out DIR for the files"
    if out_dir is not None and not targets:
        return ("--out DIR is where --export writes; add --export TARGETS (json, megatron, "
                "deepspeed, torchtitan, torchrun) or drop --out")
    if force and not targets and csv_file is None and report_file is None:
        return "--force overwrites the files of --export, --csv or --report; it needs one of them"
    if wide and as_json:
        return "--wide widens the table, which --json does not print; drop --wide"
    return None


def explain_refusal(explain: bool, **search_only) -> str | None:
    """Search constraints --explain would ignore (``search_only``: flag name to value, None
    when not given): it prices the pinned configuration whatever the search would keep, so
    --max-bubble would pass a plan over it without a word. (--top and --refine are ignored
    too, but harmlessly: a search's command line with pins and --explain added still runs.)"""
    if not explain:
        return None
    given = [f"--{name.replace('_', '-')}" for name, value in search_only.items()
             if value is not None]
    if not given:
        return None
    return (f"--explain with {' and '.join(given)}: --explain prices one pinned configuration, "
            f"not a search; drop {' and '.join(given)}, or --explain to search")


def expert_load_refusal(model, stack: Stack) -> str | None:
    """--expert-load on a dense model: it weighs the busiest GPU's routed tokens, and a dense
    model routes none, so the plans would be the same without it. Read from the stack's
    overrides (what a flag or argument changed), not its value: a stack file shared by dense
    and MoE models may set it."""
    if model.is_moe or "moe_expert_load" not in dict(stack.overrides):
        return None
    return (f"--expert-load weighs the routed experts; {model.name} is a dense model (no "
            "num_experts): drop it")
