"""Rank layout: which global rank holds which (tp, pp, dp) coordinate, on which node.

The order names the dimensions innermost first. ``tp-dp-pp`` is Megatron-LM's default order
(``tp-cp-ep-dp-pp`` with cp = ep = 1, see ``megatron.core.parallel_state.RankGenerator``):

    rank = tp_idx + tp * (dp_idx + dp * pp_idx)

so a TP group is ``tp`` consecutive ranks, and it stays inside one node whenever ``tp`` divides the
GPUs per node (ranks fill node 0 first: node = rank // gpus_per_node). ``tp-pp-dp`` puts pipeline
stages next to each other instead (DeepSpeed's ``PipeModelDataParallelTopology`` style).

The layout also says which links traffic uses: a pipeline boundary i -> i+1 or a DP group that
spans nodes goes over the inter-node network; the communication model asks
``cross_node_pp_boundaries`` and ``dp_crosses_nodes``.
"""

from __future__ import annotations

from dataclasses import dataclass

ORDERS = ("tp-dp-pp", "tp-pp-dp")
DEFAULT_ORDER = "tp-dp-pp"

Group = tuple[int, ...]


class LayoutError(ValueError):
    """A layout that breaks a placement rule (TP across nodes); the message says what to change."""


@dataclass(frozen=True)
class RankInfo:
    """One GPU: its global rank, node, rank within the node and parallel coordinates."""

    rank: int
    node: int
    local_rank: int
    tp: int
    pp: int
    dp: int


@dataclass(frozen=True)
class RankLayout:
    """Every rank's place and the process groups of each dimension (each a tuple of rank tuples)."""

    order: str
    tp: int
    pp: int
    dp: int
    gpus_per_node: int
    ranks: tuple[RankInfo, ...]
    tp_groups: tuple[Group, ...]
    pp_groups: tuple[Group, ...]
    dp_groups: tuple[Group, ...]
    embedding_groups: tuple[Group, ...]
    cross_node_pp_boundaries: tuple[int, ...]
    dp_crosses_nodes: bool

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    @property
    def tp_within_node(self) -> bool:
        """True when no TP group spans two nodes (TP traffic then stays on NVLink)."""
        return not _crossing_groups(self.tp_groups, self.gpus_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def to_dict(self) -> dict:
        """The plan JSON's ``layout`` object (DESIGN.md §2): plain lists, JSON-ready."""
        return {
            "order": self.order,
            "tp_groups": [list(g) for g in self.tp_groups],
            "pp_groups": [list(g) for g in self.pp_groups],
            "dp_groups": [list(g) for g in self.dp_groups],
            "embedding_groups": [list(g) for g in self.embedding_groups],
            "ranks": [{"rank": r.rank, "node": r.node, "local_rank": r.local_rank,
                       "tp": r.tp, "pp": r.pp, "dp": r.dp} for r in self.ranks],
            "cross_node": {"pp_boundaries": list(self.cross_node_pp_boundaries),
                           "dp": self.dp_crosses_nodes},
        }


def rank_of(tp_idx: int, pp_idx: int, dp_idx: int, tp: int, pp: int, dp: int,
            order: str = DEFAULT_ORDER) -> int:
    """The global rank at coordinate (tp_idx, pp_idx, dp_idx) for the given order."""
    if order == "tp-dp-pp":
        return tp_idx + tp * (dp_idx + dp * pp_idx)
    if order == "tp-pp-dp":
        return tp_idx + tp * (pp_idx + pp * dp_idx)
    raise LayoutError(f"unknown rank order '{order}'; choose one of {', '.join(ORDERS)}")


def build_layout(tp: int, pp: int, dp: int, gpus_per_node: int,
                 order: str = DEFAULT_ORDER) -> RankLayout:
    """Place tp*pp*dp ranks on nodes of ``gpus_per_node`` GPUs and derive every group."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise LayoutError(f"{name} must be a positive integer, got {value!r}")
    if order not in ORDERS:
        raise LayoutError(f"unknown rank order '{order}'; choose one of {', '.join(ORDERS)}")

    coords: dict[int, tuple[int, int, int]] = {}
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                coords[rank_of(t, p, d, tp, pp, dp, order)] = (t, p, d)
    ranks = tuple(RankInfo(rank=r, node=r // gpus_per_node, local_rank=r % gpus_per_node,
                           tp=coords[r][0], pp=coords[r][1], dp=coords[r][2])
                  for r in range(tp * pp * dp))

    def at(t: int, p: int, d: int) -> int:
        return rank_of(t, p, d, tp, pp, dp, order)

    # Groups are listed in the order of their smallest rank, as Megatron enumerates them.
    tp_groups = _sorted(tuple(at(t, p, d) for t in range(tp)) for p in range(pp) for d in range(dp))
    pp_groups = _sorted(tuple(at(t, p, d) for p in range(pp)) for t in range(tp) for d in range(dp))
    dp_groups = _sorted(tuple(at(t, p, d) for d in range(dp)) for t in range(tp) for p in range(pp))
    # Tied input/output embeddings: the first and last stage of each pipeline all-reduce the
    # embedding gradient (Megatron's embedding group); a single rank when pp == 1.
    embedding_groups = tuple((g[0], g[-1]) if len(g) > 1 else (g[0],) for g in pp_groups)

    boundaries = tuple(i for i in range(pp - 1)
                       if any(g[i] // gpus_per_node != g[i + 1] // gpus_per_node
                              for g in pp_groups))
    return RankLayout(order=order, tp=tp, pp=pp, dp=dp, gpus_per_node=gpus_per_node, ranks=ranks,
                      tp_groups=tp_groups, pp_groups=pp_groups, dp_groups=dp_groups,
                      embedding_groups=embedding_groups, cross_node_pp_boundaries=boundaries,
                      dp_crosses_nodes=bool(_crossing_groups(dp_groups, gpus_per_node)))


def check_layout(layout: RankLayout) -> list[str]:
    """Problems with a layout, one sentence each (empty when it is fine)."""
    problems = []
    gpn = layout.gpus_per_node
    crossing = _crossing_groups(layout.tp_groups, gpn)
    if crossing:
        g = crossing[0]
        nodes = sorted({r // gpn for r in g})
        hint = (f"tp={layout.tp} must divide gpus per node ({gpn})" if gpn % layout.tp
                else "use order tp-dp-pp or tp-pp-dp so TP ranks are consecutive")
        if layout.tp > gpn:
            hint = f"tp={layout.tp} exceeds gpus per node ({gpn}); lower tp to at most {gpn}"
        problems.append(
            f"TP group {list(g)} crosses nodes {' and '.join(map(str, nodes))}: {hint} "
            f"({len(crossing)} of {len(layout.tp_groups)} TP groups cross nodes)")
    if layout.world_size % gpn:
        problems.append(f"{layout.world_size} GPUs do not fill whole nodes of {gpn}; "
                        f"the last node is partly used")
    return problems


def require_node_local_tp(layout: RankLayout) -> None:
    """Raise LayoutError with the reason when any TP group spans two nodes."""
    crossing = [p for p in check_layout(layout) if p.startswith("TP group")]
    if crossing:
        raise LayoutError(crossing[0])


def _sorted(groups) -> tuple[Group, ...]:
    return tuple(sorted(set(groups), key=lambda g: g[0]))


def _crossing_groups(groups: tuple[Group, ...], gpus_per_node: int) -> list[Group]:
    return [g for g in groups if g[0] // gpus_per_node != g[-1] // gpus_per_node
            or len({r // gpus_per_node for r in g}) > 1]


def stage_hop_crosses_nodes(a: int, b: int, tp: int, dp: int, gpus_per_node: int) -> bool:
    """Whether activations from pipeline stage ``a`` to stage ``b`` leave a node, in the default
    tp-dp-pp order, without building the layout (the search asks this per candidate).

    Stage s owns ranks [s·tp·dp, (s+1)·tp·dp) and rank x sends to x + (b - a)·tp·dp. With
    stride d = |b - a|·tp·dp and lo the first rank of the lower stage, some x crosses a node
    boundary iff d >= G or (lo mod G) + tp·dp + d > G (the x mod G range reaches G - d).
    ``tests/test_layout.py`` checks this against :func:`build_layout`."""
    if a == b:
        return False
    width = tp * dp
    d = abs(b - a) * width
    lo = min(a, b) * width
    return d >= gpus_per_node or lo % gpus_per_node + width + d > gpus_per_node


def dp_group_crosses_nodes(tp: int, dp: int, pp: int, gpus_per_node: int) -> bool:
    """Whether any DP group spans two nodes (tp-dp-pp order): the group of stage s lies inside
    the block [s·tp·dp, (s+1)·tp·dp), which crosses a node iff it straddles a multiple of G."""
    if dp == 1:
        return False
    width = tp * dp
    return any((s * width) % gpus_per_node + width > gpus_per_node for s in range(pp))
