"""Render a Profile as a rich table: one row per run of identical layers ("block x32")."""

from __future__ import annotations

from rich.table import Table

from planner.core.text import for_rich
from planner.profiling.record import LayerTiming, Profile


def _groups(profile: Profile) -> list[tuple[LayerTiming, int, int]]:
    """(timing, first layer index, count) for each run of consecutive layers sharing a timing."""
    out: list[tuple[LayerTiming, int, int]] = []
    for i, timing in enumerate(profile.layers):
        if out and out[-1][0] is timing:
            t, first, n = out[-1]
            out[-1] = (t, first, n + 1)
        else:
            out.append((timing, i, 1))
    return out


def _ms(seconds: float, flops: float = 1.0) -> str:
    return f"{seconds * 1e3:,.2f}" if seconds and flops else "-"


def _flops(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f}"


def profile_table(profile: Profile) -> Table:
    """Per-layer table: FLOPs, the three passes' median times (ms, per layer), their spread over
    the repeats, achieved TFLOP/s and its share of the device's measured peak, the share of the
    whole step (all layers, forward + backward) and a marker for scaled measurements."""
    step_s = sum(t.total_s for t in profile.layers) or 1.0
    peak = profile.peak_flops
    title = (f"{for_rich(profile.model_name)} on {for_rich(profile.device_name)} "
             f"({for_rich(profile.device)}, {for_rich(profile.dtype)}) - "
             f"tp {profile.tp}, micro-batch {profile.micro_batch}, seq {profile.seq_len}")
    table = Table(title=title, title_justify="left")
    for header in ("layers", "kind", "shape (per TP rank)", "FLOPs fwd+bwd"):
        table.add_column(header, justify="left" if header != "FLOPs fwd+bwd" else "right")
    for header in ("fwd ms", "bwd-input ms", "bwd-weight ms", "spread", "attn % fwd", "TFLOP/s",
                   "of peak", "step %", "scaled"):
        table.add_column(header, justify="right")
    for timing, first, count in _groups(profile):
        label = f"{first}" if count == 1 else f"{first}-{first + count - 1}"
        kind = timing.kind if count == 1 else f"{timing.kind} ×{count}"
        rate = timing.total_flops / timing.total_s if timing.total_s else 0.0
        attn = f"{100 * timing.attention_fwd_s / timing.fwd_s:.0f}" if timing.attention_fwd_s else "-"
        scaled = f"×{timing.scaled:,.1f}" if timing.scaled != 1.0 else ""
        spread = "-" if timing.spread is None else f"{timing.spread:.0%}"
        table.add_row(label, kind, timing.shape, _flops(timing.total_flops), _ms(timing.fwd_s),
                      _ms(timing.bwd_input_s, timing.bwd_input_flops),
                      _ms(timing.bwd_weight_s, timing.bwd_weight_flops), spread, attn,
                      f"{rate / 1e12:.3f}", f"{rate / peak:.0%}" if peak else "-",
                      f"{100 * timing.total_s * count / step_s:.1f}", scaled)
    table.caption = "\n".join(profile_notes(profile))
    return table


def profile_notes(profile: Profile) -> list[str]:
    """The caption: the step, its MFU against the measured peak, how the numbers were taken, and
    a warning when the repeats disagree."""
    step_s = sum(t.total_s for t in profile.layers) or 1.0
    flops = sum(t.total_flops for t in profile.layers)
    env = profile.environment
    lines = [f"step (one micro-batch, all layers): {step_s * 1e3:,.1f} ms"]
    if profile.peak_flops:
        lines[0] += (f", {flops / step_s / 1e12:.3f} TFLOP/s = MFU "
                     f"{flops / step_s / profile.peak_flops:.1%} of this device's measured peak "
                     f"{profile.peak_flops / 1e12:.3f} TFLOP/s (best square matmul)")
    lines.append(f"times: the median of {env.get('repeats', '?')} timed repeats per pass (fewer "
                 "only when the budget is short, never under 3); spread = (slowest - fastest) / "
                 "median. Scaled rows were measured at a reduced shape (measured_at in the JSON) "
                 "and scaled by FLOPs.")
    if profile.noisy:
        drift = env.get("peak", {}).get("drift", 0.0)
        lines.append(f"warning: this machine is noisy: repeats differed by up to "
                     f"{profile.spread:.0%} and the matmul rate drifted {drift:+.0%} during the "
                     "profile; profile on an idle machine or raise --repeats")
    return lines
