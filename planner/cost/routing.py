"""Where a token's experts are: how many EP ranks, or NVLink domains of them, hold at least one
of the k experts a token is routed to. DeepEP sends a token once to each rank that holds one of
its experts and once over the network to each other domain (cost/moe.py deepep_s), so these
counts, not k, set its traffic; an all-to-all that sends every routed copy does not use them.

Experts are laid out in order over the EP ranks (Megatron-Core and torchtitan place experts
[r·E/ep, (r+1)·E/ep) on EP rank r), so a "part" is a block of E/parts consecutive experts: a
rank (parts = ep) or a domain of them (parts = the EP group's domains).

Two routings:
- "scores": the router's top-k of its scores, balanced (the load knob's 1.0): a token's k
  experts uniform over the experts, without repeats. With group-limited routing (DeepSeek-V3's
  node-limited routing, Layer.moe_groups / moe_group_top_k: "we ensure that each token will be
  sent to at most M nodes", report sec. 2.1.2) the token's moe_group_top_k groups are uniform
  over the groups and its k experts uniform over theirs.
- "round_robin": NeMo Automodel's FakeBalancedGate, "Load balanced gate implementation, spreads
  tokens uniformly across all experts", whose indices are "torch.arange(x.size(0) * a_exp
  ...).view(-1, a_exp) % available_experts" (nemo_automodel/components/moe/layers.py): token t
  goes to the k consecutive experts from t·k mod E.
"""

from __future__ import annotations

from math import comb, gcd
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from planner.model.spec import Layer

ROUTINGS = ("scores", "round_robin")


def parts_per_token(layer: Layer, parts: int, routing: str = "scores") -> float:
    """Expected number of ``parts`` (equal blocks of consecutive experts) that hold at least one
    of a token's experts."""
    e, k = layer.num_experts, layer.moe_top_k
    if parts <= 1 or not e:
        return 1.0 if e else 0.0
    if routing == "round_robin" and e % parts == 0:
        return _round_robin(e, k, parts)
    groups, chosen = layer.moe_groups, layer.moe_group_top_k
    if groups > 1 and chosen < groups and e % parts == 0:
        if parts % groups == 0:  # each group spans parts / groups parts
            pool, per = chosen * e // groups, e // parts
            return chosen * parts // groups * (1 - comb(pool - per, k) / comb(pool, k))
        if groups % parts == 0:  # each part holds groups / parts whole groups
            return parts * _groups_in_part(e, k, groups, chosen, groups // parts)
    return _uniform(e, k, parts)


def _uniform(e: int, k: int, parts: int) -> float:
    """k distinct experts uniform over e: a part of e/parts experts receives none with
    probability C(e - e/parts, k) / C(e, k) = prod_{i<k} (e - e/parts - i) / (e - i)."""
    per = e / parts
    miss = 1.0
    for i in range(k):
        miss *= max(0.0, (e - per - i) / (e - i))
    return parts * (1 - miss)


def _groups_in_part(e: int, k: int, groups: int, chosen: int, held: int) -> float:
    """Probability that a part holding ``held`` whole groups receives one of the token's experts:
    j of its groups are among the ``chosen`` (hypergeometric), and then none of the k experts,
    uniform over the chosen groups' experts, falls in those j groups."""
    per_group, pool = e // groups, chosen * e // groups
    hit = 0.0
    for j in range(min(held, chosen) + 1):
        p_j = comb(held, j) * comb(groups - held, chosen - j) / comb(groups, chosen)
        hit += p_j * (1 - comb(pool - j * per_group, k) / comb(pool, k))
    return hit


def _round_robin(e: int, k: int, parts: int) -> float:
    """Mean number of parts the k consecutive experts from t·k mod e touch, over the starts t·k
    mod e takes (the multiples of gcd(k, e), equally often)."""
    per, step = e // parts, gcd(k, e)
    starts = range(0, e, step)
    return sum(len({((s + i) % e) // per for i in range(k)}) for s in starts) / len(starts)
