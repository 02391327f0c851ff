"""The mixture-of-experts presets (profiles/models/, planner/model/load.py presets): their
parameter counts against the counts their makers and transformers publish."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.model.load import load_model, moe_preset_names, presets

runner = CliRunner()

# (total, active per token) as published. Mixtral 8x7B: 46,702,792,704 is the sum of its
# released architecture (32,000 x 4,096 embedding and head, 32 blocks of GQA attention, eight
# 4,096 x 14,336 SwiGLU experts and a router each, the norms), which the paper rounds: "each token
# has access to 47B parameters, but only uses 13B active parameters during inference" (Jiang et
# al. 2024, 'Mixtral of Experts', arXiv 2401.04088). Qwen3: the model cards (Qwen/Qwen3-30B-A3B,
# Qwen/Qwen3-235B-A22B) give 30.5B in total with 3.3B activated, and 235B with 22B activated.
# Mixtral 8x22B: "It is a sparse Mixture-of-Experts (SMoE) model that uses only 39B active
# parameters out of 141B" (Mistral AI, 'Cheaper, Better, Faster, Stronger', 2024-04-17,
# mistral.ai/news/mixtral-8x22b): rounded figures, so within 1% and 2%.
PUBLISHED = {"mixtral-8x7b": (46_702_792_704, 12.9e9), "qwen3-30b-a3b": (30.5e9, 3.3e9),
             "qwen3-235b-a22b": (235e9, 22e9), "mixtral-8x22b": (141e9, 39e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_preset_counts_are_the_published_ones(name):
    spec = load_model(name)
    total, active = PUBLISHED[name]
    assert spec.is_moe
    assert spec.params == pytest.approx(total, rel=0.005 if name != "mixtral-8x22b" else 0.01)
    assert spec.active_params == pytest.approx(active, rel=0.02)


def test_deepseek_v3_is_the_released_model_with_its_mtp_module():
    """DeepSeek-V3 report: "671B total parameters with 37B activated for each token", the main
    model; the released checkpoint adds the 1-depth MTP module (HuggingFace lists 685B, with the
    shared embedding and head stored twice). The preset carries the MTP module: between the two."""
    spec = load_model("deepseek-v3")
    assert 671e9 < spec.params < 685e9
    assert 37e9 < spec.active_params < 39e9


def test_presets_list_dense_then_moe_and_names_are_suggested():
    names = list(presets())
    assert names[-len(moe_preset_names()):] == list(moe_preset_names())
    assert {"mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b",
            "deepseek-v3"} <= set(names)
    with pytest.raises(PlanInputError, match="did you mean 'mixtral-8x7b'"):
        load_model("mixtral-8x7")
    listing = runner.invoke(app, ["models"], env={"COLUMNS": "100"})
    assert "mixtral-8x7b" in listing.output and "46.70B" in listing.output
    shown = runner.invoke(app, ["models", "show", "mixtral-8x7b"])
    assert shown.output.startswith("mixtral-8x7b: 46.70B parameters, 12.88B active per token")
