"""Render a Profile as a rich table: one row per run of identical layers ("block x32")."""

from __future__ import annotations

from rich.table import Table

from planner.profile.profiler import LayerTiming, Profile


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
    """Per-layer table: FLOPs, the three passes' times (ms, per layer), achieved TFLOP/s, the share
    of the whole step (all layers, forward + backward) and a marker for scaled measurements."""
    step_s = sum(t.total_s for t in profile.layers) or 1.0
    title = (f"{profile.model_name} on {profile.device_name} ({profile.device}, {profile.dtype}) - "
             f"tp {profile.tp}, micro-batch {profile.micro_batch}, seq {profile.seq_len}")
    table = Table(title=title, title_justify="left")
    for header in ("layers", "kind", "shape (per TP rank)", "FLOPs fwd+bwd"):
        table.add_column(header, justify="left" if header != "FLOPs fwd+bwd" else "right")
    for header in ("fwd ms", "bwd-input ms", "bwd-weight ms", "attn % fwd", "TFLOP/s", "step %",
                   "scaled"):
        table.add_column(header, justify="right")
    for timing, first, count in _groups(profile):
        label = f"{first}" if count == 1 else f"{first}-{first + count - 1}"
        kind = timing.kind if count == 1 else f"{timing.kind} ×{count}"
        rate = timing.total_flops / timing.total_s / 1e12 if timing.total_s else 0.0
        attn = f"{100 * timing.attention_fwd_s / timing.fwd_s:.0f}" if timing.attention_fwd_s else "-"
        scaled = f"×{timing.scaled:,.1f}" if timing.scaled != 1.0 else ""
        table.add_row(label, kind, timing.shape, _flops(timing.total_flops), _ms(timing.fwd_s),
                      _ms(timing.bwd_input_s, timing.bwd_input_flops),
                      _ms(timing.bwd_weight_s, timing.bwd_weight_flops), attn, f"{rate:.3f}",
                      f"{100 * timing.total_s * count / step_s:.1f}", scaled)
    table.caption = (f"step (one micro-batch, all layers): {step_s * 1e3:,.1f} ms. Times are per layer; "
                     "scaled rows were measured at a reduced shape (see measured_at in the JSON) "
                     "and scaled by FLOPs.")
    return table
