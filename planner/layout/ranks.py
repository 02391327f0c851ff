"""Rank layout: which global rank holds which (tp, cp, pp, dp) coordinate, on which node.

The order names the dimensions innermost first. ``tp-cp-ep-dp-pp`` is Megatron-LM's default order
(``megatron.core.parallel_state.RankGenerator``); with cp = ep = 1 it is

    rank = tp_idx + tp * (dp_idx + dp * pp_idx)

so a TP group is ``tp`` consecutive ranks, and it stays inside one node whenever ``tp`` divides the
GPUs per node (ranks fill node 0 first: node = rank // gpus_per_node). ``tp-cp-ep-pp-dp`` puts
pipeline stages next to each other instead (Megatron's ``--use-tp-pp-dp-mapping``, DeepSpeed's
``PipeModelDataParallelTopology`` style).

The layout also says which links traffic uses: a pipeline boundary i -> i+1 or a DP group that
spans nodes goes over the inter-node network; the communication model asks
``cross_node_pp_boundaries`` and ``dp_crosses_nodes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod

import numpy as np

from planner.core.limits import MAX_GPUS, MAX_GPUS_PER_NODE

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
# The 3D names of the same orders (cp = ep = 1), as earlier plan3d releases wrote them.
ORDER_ALIASES = {"tp-dp-pp": "tp-cp-ep-dp-pp", "tp-pp-dp": "tp-cp-ep-pp-dp"}

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
    cp: int = 0


@dataclass(frozen=True)
class RankLayout:
    """Every rank's place and the process groups of each dimension (each a tuple of rank tuples).

    Expert layers regroup the tp·cp·dp ranks of a stage into expert-tensor (etp), expert (ep) and
    expert-data (edp) groups, as Megatron-Core's second RankGenerator does; with ep = etp = 1 and
    tp = 1 those are trivial."""

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
    cp: int = 1
    ep: int = 1
    etp: int = 1
    cp_groups: tuple[Group, ...] = ()
    ep_groups: tuple[Group, ...] = ()
    expert_tp_groups: tuple[Group, ...] = ()
    expert_dp_groups: tuple[Group, ...] = ()
    # GPUs in one NVLink domain (a multiple of gpus_per_node: 72 on GB200 NVL72); 0 = one node.
    nvlink_domain: int = 0

    @property
    def domain(self) -> int:
        """The GPUs TP, CP and EP groups may span on NVLink: the NVLink domain, else a node."""
        return self.nvlink_domain or self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    @property
    def tp_within_node(self) -> bool:
        """True when no TP group leaves its NVLink domain (a node on HGX boards; the 72-GPU rack
        on GB200 NVL72), so TP traffic stays on NVLink."""
        return not _crossing_groups(self.tp_groups, self.domain)

    def within_domain(self, groups: tuple[Group, ...]) -> bool:
        """True when every group lies inside one NVLink domain."""
        return not _crossing_groups(groups, self.domain)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def to_dict(self) -> dict:
        """The plan JSON's ``layout`` object (DESIGN.md §2): plain lists, JSON-ready. The cp and
        expert groups appear only where those degrees are used (a 3D plan's JSON stays 3D)."""
        five_d = self.cp > 1 or self.ep > 1 or self.etp != self.tp
        out = {
            "order": self.order,
            "tp_groups": [list(g) for g in self.tp_groups],
            "pp_groups": [list(g) for g in self.pp_groups],
            "dp_groups": [list(g) for g in self.dp_groups],
            "embedding_groups": [list(g) for g in self.embedding_groups],
            "ranks": [{"rank": r.rank, "node": r.node, "local_rank": r.local_rank,
                       "tp": r.tp, "pp": r.pp, "dp": r.dp, **({"cp": r.cp} if five_d else {})}
                      for r in self.ranks],
            "cross_node": {"pp_boundaries": list(self.cross_node_pp_boundaries),
                           "dp": self.dp_crosses_nodes},
        }
        if five_d:
            out.update({"cp_groups": [list(g) for g in self.cp_groups],
                        "ep_groups": [list(g) for g in self.ep_groups],
                        "expert_tp_groups": [list(g) for g in self.expert_tp_groups],
                        "expert_dp_groups": [list(g) for g in self.expert_dp_groups]})
        return out


def canonical_order(order: str) -> str:
    """Megatron's name for a rank order; a 3D alias (tp-dp-pp, tp-pp-dp) maps to it."""
    order = ORDER_ALIASES.get(order, order)
    if order not in ORDERS:
        names = ", ".join(ORDERS + tuple(ORDER_ALIASES))
        raise LayoutError(f"unknown rank order '{order}'; choose one of {names}")
    return order


def rank_at(sizes: dict[str, int], index: dict[str, int], order: str) -> int:
    """The global rank at a coordinate: the order lists dimensions innermost first, and each
    dimension's stride is the product of the sizes before it (Megatron-Core's RankGenerator)."""
    rank, stride = 0, 1
    for dim in order.split("-"):
        rank += index.get(dim, 0) * stride
        stride *= sizes.get(dim, 1)
    return rank


def rank_of(tp_idx: int, pp_idx: int, dp_idx: int, tp: int, pp: int, dp: int,
            order: str = DEFAULT_ORDER, cp_idx: int = 0, cp: int = 1) -> int:
    """The global rank at coordinate (tp_idx, cp_idx, pp_idx, dp_idx) for the given order."""
    return rank_at({"tp": tp, "cp": cp, "pp": pp, "dp": dp},
                   {"tp": tp_idx, "cp": cp_idx, "pp": pp_idx, "dp": dp_idx}, canonical_order(order))


def groups_along(sizes: dict[str, int], dims: tuple[str, ...], order: str) -> tuple[Group, ...]:
    """The process groups whose members differ only along ``dims``: one group per coordinate of
    the other dimensions, members in rank order, groups in the order of their smallest rank."""
    names = order.split("-")
    # Ranks as an array with one axis per dimension, outermost first (the order is innermost first).
    grid = np.arange(prod(sizes.get(d, 1) for d in names)).reshape(
        [sizes.get(d, 1) for d in reversed(names)])
    axes = [len(names) - 1 - names.index(d) for d in dims]
    width = prod(sizes.get(d, 1) for d in dims)
    rows = np.moveaxis(grid, axes, range(grid.ndim - len(axes), grid.ndim)).reshape(-1, width)
    rows = np.sort(rows, axis=1)
    return tuple(map(tuple, rows[np.argsort(rows[:, 0], kind="stable")].tolist()))


def build_layout(tp: int, pp: int, dp: int, gpus_per_node: int, order: str = DEFAULT_ORDER,
                 cp: int = 1, ep: int = 1, etp: int | None = None,
                 nvlink_domain: int | None = None) -> RankLayout:
    """Place tp·cp·pp·dp ranks on nodes of ``gpus_per_node`` GPUs and derive every group.

    ``nvlink_domain`` (a multiple of ``gpus_per_node``; None = one node) is what TP, CP and EP
    groups must stay inside to talk over NVLink (check_layout), and where a pipeline hop or a DP
    group leaves NVLink for the network.

    Dense layers use the sizes (tp, cp, ep = 1, dp, pp); expert layers the sizes (etp, cp = 1, ep,
    edp, pp) over the same ranks, with etp·ep·edp = tp·cp·dp (Megatron-Core's two generators)."""
    etp = tp if etp is None else etp
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp), ("ep", ep), ("etp", etp),
                        ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise LayoutError(f"{name} must be a positive integer, got {value!r}")
    order = canonical_order(order)
    world = tp * cp * pp * dp
    if world > MAX_GPUS:
        raise LayoutError(f"tp*cp*pp*dp = {world} ranks; at most {MAX_GPUS:,}")
    if gpus_per_node > MAX_GPUS_PER_NODE:
        raise LayoutError(f"gpus_per_node {gpus_per_node:,}: a node holds at most "
                          f"{MAX_GPUS_PER_NODE:,} GPUs")
    if (tp * cp * dp) % (etp * ep):
        raise LayoutError(f"etp x ep = {etp * ep} must divide tp x cp x dp = {tp * cp * dp}")
    if order.endswith("pp-dp") and pp > 1 and etp * ep != tp * cp:
        # With pp inside dp, an expert generator of another inner width strides across
        # pipeline stages: expert groups would mix ranks that hold different layers.
        raise LayoutError(f"order {order} needs etp x ep = tp x cp ({tp * cp}), got {etp * ep}: "
                          f"otherwise expert groups span pipeline stages; use {DEFAULT_ORDER}")

    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    expert = {"tp": etp, "cp": 1, "ep": ep, "dp": tp * cp * dp // (etp * ep), "pp": pp}
    coords: dict[int, tuple[int, int, int, int]] = {}
    for p, d, c, t in product(range(pp), range(dp), range(cp), range(tp)):
        coords[rank_at(dense, {"tp": t, "cp": c, "dp": d, "pp": p}, order)] = (t, p, d, c)
    ranks = tuple(RankInfo(rank=r, node=r // gpus_per_node, local_rank=r % gpus_per_node,
                           tp=coords[r][0], pp=coords[r][1], dp=coords[r][2], cp=coords[r][3])
                  for r in range(world))

    # Groups are listed in the order of their smallest rank, as Megatron enumerates them.
    tp_groups = groups_along(dense, ("tp",), order)
    pp_groups = groups_along(dense, ("pp",), order)
    dp_groups = groups_along(dense, ("dp",), order)
    # Tied input/output embeddings: the first and last stage of each pipeline all-reduce the
    # embedding gradient (Megatron's embedding group); a single rank when pp == 1.
    embedding_groups = tuple((g[0], g[-1]) if len(g) > 1 else (g[0],) for g in pp_groups)

    domain = nvlink_domain if nvlink_domain and nvlink_domain % gpus_per_node == 0 \
        else gpus_per_node
    boundaries = tuple(i for i in range(pp - 1)
                       if any(g[i] // domain != g[i + 1] // domain for g in pp_groups))
    return RankLayout(order=order, tp=tp, pp=pp, dp=dp, gpus_per_node=gpus_per_node, ranks=ranks,
                      tp_groups=tp_groups, pp_groups=pp_groups, dp_groups=dp_groups,
                      embedding_groups=embedding_groups, cross_node_pp_boundaries=boundaries,
                      dp_crosses_nodes=bool(_crossing_groups(dp_groups, domain)),
                      cp=cp, ep=ep, etp=etp, nvlink_domain=0 if domain == gpus_per_node else domain,
                      cp_groups=groups_along(dense, ("cp",), order),
                      ep_groups=groups_along(expert, ("ep",), order),
                      expert_tp_groups=groups_along(expert, ("tp",), order),
                      expert_dp_groups=groups_along(expert, ("dp",), order))


def check_layout(layout: RankLayout) -> list[str]:
    """Problems with a layout, one sentence each (empty when it is fine): a TP, CP or EP group
    that leaves its NVLink domain (a node, unless the domain is larger: GB200 NVL72)."""
    problems = []
    gpn, dom = layout.gpus_per_node, layout.domain
    where = "nodes" if dom == gpn else "NVLink domains"
    unit = "gpus per node" if dom == gpn else "GPUs per NVLink domain"
    crossing = _crossing_groups(layout.tp_groups, dom)
    if crossing:
        g = crossing[0]
        parts = sorted({r // dom for r in g})
        hint = (f"tp={layout.tp} must divide {unit} ({dom})" if dom % layout.tp
                else "use order tp-dp-pp or tp-pp-dp so TP ranks are consecutive")
        if layout.tp > dom:
            hint = f"tp={layout.tp} exceeds {unit} ({dom}); lower tp to at most {dom}"
        problems.append(
            f"TP group {list(g)} crosses {where} {' and '.join(map(str, parts))}: {hint} "
            f"({len(crossing)} of {len(layout.tp_groups)} TP groups cross {where})")
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


def blocks_cross(width: int, blocks: int, domain: int) -> bool:
    """Whether any of ``blocks`` consecutive rank blocks of ``width`` ranks straddles a boundary
    of ``domain``-GPU domains: the groups of an inner dimension (tp·cp for CP, tp·cp·dp for a
    stage's DP-CP group, in tp-cp-ep-dp-pp order) each lie in one such block. Block k starts at
    k·width; (k·width) mod domain repeats with period at most ``domain``, so that many blocks
    decide. ``tests/test_layout.py`` checks it against :func:`build_layout`'s groups."""
    if width > domain:
        return True
    return any((k * width) % domain + width > domain for k in range(min(blocks, domain)))


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
