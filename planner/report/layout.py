"""Terminal picture of a rank layout: nodes x local ranks, coloured by pipeline stage.

Big clusters are shown in part: the first and last few nodes and groups, with a line saying how
many were left out, so `plan layout` stays readable for thousands of GPUs.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.layout.ranks import RankLayout

STAGE_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan",
                 "bright_magenta", "bright_green", "bright_yellow", "bright_blue", "bright_red")
MAX_NODES = 8  # nodes drawn in the grid; beyond this, the first and last half are drawn
MAX_GROUPS = 6  # groups listed per dimension


def head_tail(items: list, limit: int) -> tuple[list, int]:
    """The first and last limit/2 items, and how many were dropped in between."""
    if len(items) <= limit:
        return items, 0
    half = limit // 2
    return items[:half] + items[-half:], len(items) - 2 * half


def group_line(groups, limit: int = MAX_GROUPS) -> str:
    shown, dropped = head_tail([list(g) for g in groups], limit)
    parts = [_short(g) for g in shown]
    if dropped:
        parts.insert(len(parts) // 2, f"… {dropped} more …")
    return ", ".join(parts)


def _short(group: list[int], limit: int = 8) -> str:
    if len(group) <= limit:
        return "[" + ",".join(map(str, group)) + "]"
    return "[" + ",".join(map(str, group[:3])) + f",…({len(group) - 6})…," + \
        ",".join(map(str, group[-3:])) + "]"


def render_layout(layout: RankLayout, console: Console) -> None:
    """Draw the node grid and list the groups of each dimension below it."""
    gpn = layout.gpus_per_node
    five_d = layout.cp > 1 or layout.ep > 1 or layout.etp != layout.tp
    degrees = (f"tp={layout.tp} cp={layout.cp} pp={layout.pp} dp={layout.dp} (experts: "
               f"etp={layout.etp} ep={layout.ep})" if five_d
               else f"tp={layout.tp} pp={layout.pp} dp={layout.dp}")
    console.print(f"[bold]Rank layout[/bold] order {layout.order}: {degrees} = "
                  f"{layout.world_size} GPUs on {layout.num_nodes} node(s) of {gpn}")
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 1))
    table.add_column("node", justify="right")
    for local in range(gpn):
        table.add_column(f"gpu{local}", justify="center")
    nodes, dropped = head_tail(list(range(layout.num_nodes)), MAX_NODES)
    for i, node in enumerate(nodes):
        if dropped and i == len(nodes) // 2:
            table.add_row("…", *[Text("…", style="dim")] * gpn)
        cells = []
        for local in range(gpn):
            rank = node * gpn + local
            if rank >= layout.world_size:
                cells.append(Text("-", style="dim"))
                continue
            r = layout.ranks[rank]
            colour = STAGE_COLOURS[r.pp % len(STAGE_COLOURS)]
            coords = (r.tp, r.cp, r.pp, r.dp) if five_d else (r.tp, r.pp, r.dp)
            cells.append(Text(f"{r.rank}\n({','.join(map(str, coords))})", style=colour))
        table.add_row(str(node), *cells)
    console.print(table)
    if dropped:
        console.print(f"[dim]{dropped} nodes not shown[/dim]")
    console.print(f"[dim]cell: rank and ({'tp, cp, pp, dp' if five_d else 'tp, pp, dp'}); "
                  "colour = pipeline stage[/dim]")
    dims = [("TP", layout.tp_groups), ("PP", layout.pp_groups), ("DP", layout.dp_groups)]
    if five_d:
        dims += [("CP", layout.cp_groups), ("EP", layout.ep_groups),
                 ("expert TP", layout.expert_tp_groups), ("expert DP", layout.expert_dp_groups)]
    for name, groups in dims + [("embedding", layout.embedding_groups)]:
        console.print(f"[bold]{name} groups[/bold] ({len(groups)}): {group_line(groups)}")
    where = "nodes" if layout.domain == layout.gpus_per_node else \
        f"NVLink domains of {layout.domain}"
    tp_note = (f"TP within {where}" if layout.tp_within_node
               else f"[red]TP crosses {where}: TP traffic leaves NVLink[/red]")
    short = "nodes" if layout.domain == layout.gpus_per_node else "NVLink domains"
    pp_note = (f"PP boundaries crossing {short}: {list(layout.cross_node_pp_boundaries)}"
               if layout.cross_node_pp_boundaries else f"no PP boundary crosses {short}")
    dp_note = f"DP groups cross {short}" if layout.dp_crosses_nodes else \
        f"DP groups within {short}"
    console.print(f"{tp_note}; {pp_note}; {dp_note}")
