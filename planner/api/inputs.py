"""The API's inputs checked and turned into the planner's objects: a model, hardware, a cluster,
the pins, a stack and a search request, each raising PlanInputError with the CLI's message."""

from __future__ import annotations

from pathlib import Path

from planner.core import arguments as arg
from planner.core.errors import PlanInputError
from planner.cost.precision import check_fp8
from planner.hardware.power import power_limited
from planner.hardware.profiles import Cluster, Hardware, load_hardware, make_cluster
from planner.launchers import (expert_load_refusal, precision_allows, refuse_unbuildable,
                               stack_refusal)
from planner.model.load import load_model
from planner.model.spec import ModelSpec
from planner.profiling.record import Profile, device_mismatch, load_profile
from planner.search.profiled import check_profile_matches
from planner.search.request import Pins, Request, parse_refine
from planner.stack import Stack, resolve_stack, with_overrides


def model_spec(model, seq_len: int | None = None) -> ModelSpec:
    """``model`` (a preset name, a model file or a ModelSpec) at ``seq_len`` (None: its own)."""
    arg.source("model", model, (ModelSpec,), "a preset name or a model file path")
    arg.whole("seq_len", seq_len)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    return spec.with_seq_length(seq_len)


def hardware_of(gpu: str | None, hardware, power_limit: float | None = None) -> Hardware:
    """A bundled GPU by name, or ``hardware`` (a file or Hardware), capped at ``power_limit``
    watts where given."""
    arg.text("gpu", gpu)
    arg.source("hardware", hardware, (Hardware,), "a hardware JSON path")
    if gpu is not None and hardware is not None:
        raise PlanInputError("give gpu (a bundled GPU's name) or hardware (a file or Hardware), "
                             "not both")
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(gpu, hardware)
    if power_limit is not None:
        hw = power_limited(hw, arg.number("power_limit", power_limit, low=0, low_open=True))
    return hw


def cluster_of(gpus: int, nodes: int, gpu: str | None, hardware,
               power_limit: float | None = None) -> Cluster:
    """The cluster of ``gpus`` GPUs on ``nodes`` nodes of :func:`hardware_of`'s GPU."""
    arg.whole("gpus", gpus, optional=False)
    arg.whole("nodes", nodes, optional=False)
    return make_cluster(hardware_of(gpu, hardware, power_limit), gpus, nodes)


def check_pins(pins: dict) -> dict:
    """The pins by kind: degrees and counts whole and positive, zero a stage from 0, schedule and
    recompute names, sequence_parallel a real bool."""
    for key, value in pins.items():
        if key in ("schedule", "recompute"):
            arg.text(key, value)
        elif key == "sequence_parallel":
            arg.flag(key, value)
        else:
            arg.whole(key, value, low=0 if key == "zero" else 1)
    return pins


def stack_of(stack, launcher=None, flash=None, overlap=None, tp_overlap=None,
             grad_dtype=None, precision=None) -> Stack:
    """A Stack as given, or resolved like the CLI's --stack and its override flags."""
    arg.source("stack", stack, (Stack,), "a stack name or file path")
    arg.text("launcher", launcher)
    for name, value in (("flash", flash), ("overlap", overlap), ("tp_overlap", tp_overlap)):
        arg.flag(name, value)  # flash='no' is truthy: it planned flash attention
    arg.text("grad_dtype", grad_dtype)
    arg.text("precision", precision)
    if isinstance(stack, Stack):
        overrides = (flash, overlap, tp_overlap, grad_dtype, precision)
        if any(x is not None for x in overrides):
            raise PlanInputError("pass a stack name or file to combine it with flash, overlap, "
                                 "tp_overlap, grad_dtype or precision; a Stack object is used "
                                 "as it is")
        return stack
    return resolve_stack(stack, launcher, flash, overlap, tp_overlap, grad_dtype, precision)


def with_expert_load(stack: Stack, expert_load: float | None) -> Stack:
    """``expert_load`` (MoE: the busiest GPU's routed tokens over the mean) over the stack's."""
    if expert_load is None:
        return stack
    arg.number("expert_load", expert_load, low=0, low_open=True)
    return with_overrides(stack, "expert_load", moe_expert_load=expert_load)


def request_of(gpus, nodes, model, gpu, hardware, global_batch, global_batch_range, seq_len,
               max_bubble, top, refine, launcher, partition_solver, profile, stack: Stack,
               pins: dict, power_limit: float | None = None, asked: str | None = None) -> Request:
    """The search request of `plan solve`: every argument checked, the model, cluster and profile
    loaded, and the CLI's refusals (a profile of another device, a stack or precision the
    launcher cannot run, an expert load on a dense model) raised as PlanInputError; ``asked``
    names the flag that chose the launcher (``--export megatron``) in such a line."""
    arg.whole("global_batch", global_batch)
    arg.number("max_bubble", max_bubble)
    arg.whole("top", top, optional=False)
    if not isinstance(refine, str):
        arg.whole("refine", refine, optional=False)
    arg.text("partition", partition_solver, optional=False)
    arg.source("profile", profile, (Profile,), "a profile file path")
    batch_range = arg.pair("global_batch_range", global_batch_range)
    check_pins(pins)
    spec = model_spec(model, seq_len)
    refuse_unbuildable(launcher, spec)  # e.g. torchtitan builds only its own flavors
    measured = load_profile(profile) if isinstance(profile, (str, Path)) else profile
    if measured is not None:
        check_profile_matches(measured, spec)
    cluster = cluster_of(gpus, nodes, gpu, hardware, power_limit)
    check_fp8(cluster.hardware, stack)  # FP8 on a GPU without FP8: one line
    # the CLI's rules: a profile of another device, a stack another launcher runs (its plans
    # would not run as priced), a precision the launcher lacks (DeepSpeed has no FP8)
    rule = (device_mismatch(measured, cluster.hardware) or stack_refusal(stack, launcher, asked)
            or precision_allows(launcher, spec, stack)
            or expert_load_refusal(spec, stack))  # dense: nothing routed to weigh
    if rule:
        raise PlanInputError(rule)
    return Request(model=spec, cluster=cluster,
                   global_batch=global_batch, batch_range=batch_range, max_bubble=max_bubble,
                   profile=measured, pins=Pins(**pins), top=top, refine=parse_refine(refine),
                   launcher=launcher, partition_method=partition_solver, options=stack)
