"""The source documents behind the validation cases, and the values that were chosen from their
end-to-end rows.

A group (a case's ``group``) is one table or sweep; a source is the document, or the team's
set of documents, it came from: llm-foundry's three benchmark tables are one source, as are the
two versions of torchtitan's performance page and BigScience's README and chronicles. Held-out
figures hold a whole source out, so that a value chosen on one of its tables cannot vouch for
another.

A value "chosen from rows" is one whose only evidence is a published end-to-end run: a least-squares
fit, or a share derived from two measured step times. Each names its source, and the value the
planner prices when that source is held out: what is known without it (nothing measured: the
mechanism off). planner/fidelity/holdout.py prices every source's rows that way;
tests/test_holdout.py checks each entry against the bundled file that sets it.

Not listed, because their evidence is not end-to-end rows (each says so where it is set): the
fragmentation shares (cost/constants.py: GMLake's measured fragmentation, with BLOOM's memory
readings in view), the Triton attention factors (cost/attention_kernel.py: FlashAttention-2's
paper, llm-foundry's rows in view), and every value a component or case quotes from its source's
code or launch flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import PlanInputError


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    groups: tuple[str, ...]

    def __post_init__(self):
        if not self.key or not self.groups:
            raise PlanInputError(f"source {self.key!r}: needs a key and at least one group")


SOURCES = (
    Source("narayanan2021", "Narayanan et al. 2021, Table 1", ("megatron2021_table1",)),
    Source("megatron-readme", "Megatron-LM README, GPT-3 175B", ("megatron_readme",)),
    Source("bigscience", "BigScience tr11 (BLOOM-176B) README and chronicles",
           ("bloom", "bloom_sweep_0228")),
    Source("zero-bubble", "Qi et al. 2023, Zero Bubble, Table 4", ("zero_bubble_table4",)),
    Source("llm-foundry", "llm-foundry MPT training benchmarks",
           ("llmfoundry_mpt_h100_80gb", "llmfoundry_mpt_a100_80gb", "llmfoundry_mpt_a100_40gb")),
    Source("torchtitan", "torchtitan docs/performance.md (A100 and H100 versions)",
           ("torchtitan_a100_fsdp2", "torchtitan_h100_bf16", "torchtitan_h100_float8")),
    Source("llama3-paper", "Llama 3 Herd of Models, Table 4", ("llama3_405b_paper",)),
    Source("nemo-2407", "NeMo 24.07 performance summary", ("nemo2407_h100_fp8",)),
    Source("megatron-moe-zoo", "Megatron MoE Model Zoo, Qwen3", ("moe_megatron_qwen3_h100",)),
    Source("automodel", "NeMo Automodel performance summary", ("moe_automodel_h100",)),
    Source("deepseek-v3", "DeepSeek-V3 technical report", ("moe_deepseek_v3_report",)),
)
_BY_GROUP = {g: s.key for s in SOURCES for g in s.groups}


def source_of(group: str) -> str:
    """The source a group of cases came from; a group of the user's own runs is its own."""
    return _BY_GROUP.get(group, group)


ORIGINS = ("component", "stack", "config")


@dataclass(frozen=True)
class RowChosen:
    """A value whose only evidence is its source's end-to-end rows, and what is priced without
    them. ``field`` is the stack field it sets, through a component, a bundled stack or a case's
    own configuration (``origin``), named ``name``."""

    source: str
    origin: str  # what sets it: "component", "stack" or the case's "config"
    name: str  # the component or stack's name, or the config key
    field: str
    value: object  # as the bundled files set it
    held_out: object  # priced for the source's rows when the source is held out
    why: str

    def __post_init__(self):
        if self.source not in {s.key for s in SOURCES}:
            raise PlanInputError(f"row-chosen {self.field}: unknown source {self.source!r}")
        if self.origin not in ORIGINS:
            raise PlanInputError(f"row-chosen {self.field}: origin must be one of {ORIGINS}")

    @property
    def where(self) -> str:
        return f"{self.origin} {self.name}" if self.origin != "config" else f"config.{self.name}"


ROW_CHOSEN = (
    RowChosen("bigscience", "component", "bigscience-tr11", "host_s_per_block", 0.0045, 0.0,
              "a least-squares fit to 12 rows of BigScience's 2022-02-28 sweep (cost/host.py); "
              "no other source measures blocking launches"),
    RowChosen("torchtitan", "stack", "torchtitan", "tp_overlap_hidden", 0.23, 0.0,
              "derived from torchtitan's 2D against 2D + AsyncTP rows (performance.md Table 4)"),
    RowChosen("megatron-moe-zoo", "config", "expert_load", "moe_expert_load", 1.43, 1.0,
              "derived from the same readme's forced-balance against dropless rows "
              "(moe_runs.json provenance)"),
)


def row_chosen(source: str) -> tuple[RowChosen, ...]:
    """The values chosen from ``source``'s rows."""
    return tuple(r for r in ROW_CHOSEN if r.source == source)
