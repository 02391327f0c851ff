"""Rank layout (minimal; replaced by the full module of the layout branch)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class RankLayout:
    tp: int
    pp: int
    dp: int
    gpus_per_node: int

    def to_dict(self) -> dict:
        ranks = []
        for rank in range(self.tp * self.pp * self.dp):
            t, rest = rank % self.tp, rank // self.tp
            d, p = rest % self.dp, rest // self.dp
            ranks.append({"rank": rank, "node": rank // self.gpus_per_node,
                          "local_rank": rank % self.gpus_per_node, "tp": t, "pp": p, "dp": d})
        return {"order": "tp-dp-pp", "ranks": ranks}


def build_layout(tp, pp, dp, gpus_per_node, order="tp-dp-pp") -> RankLayout:
    return RankLayout(tp, pp, dp, gpus_per_node)
