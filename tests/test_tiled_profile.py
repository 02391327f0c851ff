"""The profiler's memory ceiling (issue #31 item 2): a layer whose weights do not fit is timed
with its weights held as column tiles (planner/profiling/tiled.py), doing the full layer's work;
tokens past the cap are refused before anything is allocated."""

import numpy as np
import pytest
from typer.testing import CliRunner

import planner.profiling.profiler as profiler
from cli import app
from planner.core.errors import PlanInputError
from planner.core.limits import MAX_PROFILE_TOKENS
from planner.model.spec import Layer, ModelSpec
from planner.profiling.executors import build_executor, working_set_bytes
from planner.profiling.profiler import profile_model, tiles_needed

LAYERS = [
    Layer(kind="block", hidden_size=8, num_attention_heads=2, num_kv_heads=1, ffn_hidden_size=12,
          mlp="swiglu", norm="rmsnorm", bias=False),
    Layer(kind="block", hidden_size=8, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=10,
          mlp="gelu", norm="layernorm", bias=True),
    Layer(kind="head", hidden_size=8, vocab_size=13, norm="rmsnorm"),
    Layer(kind="linear", hidden_size=8, out_features=11, bias=True),
]


def _passes(ex):
    ex.forward()
    ex.backward_input()
    ex.backward_weight()
    return ex


@pytest.mark.parametrize("layer", LAYERS, ids=lambda l: l.kind + l.mlp)
@pytest.mark.parametrize("tiles", [2, 3, 64])
def test_a_tiled_layer_computes_what_the_whole_layer_computes(layer, tiles):
    tiled = _passes(build_executor(layer, 2, 3, dtype="float64", tiles=tiles))
    whole = build_executor(layer, 2, 3, dtype="float64")
    for name, width in tiled.widths.items():  # the whole layer's weight: the tile repeated
        tile = tiled.params[name]
        assert tile.shape[1] == -(-width // tiles) < width
        whole.params[name][...] = np.tile(tile, (1, tiles))[:, :width]
    for name, value in tiled.params.items():
        if name not in tiled.widths:
            whole.params[name][...] = value
    _passes(whole)
    np.testing.assert_allclose(np.asarray(tiled.out), np.asarray(whole.out), rtol=1e-12)
    np.testing.assert_allclose(tiled.dx, whole.dx, rtol=1e-10, atol=1e-14)
    for name, width in tiled.widths.items():  # the one gradient tile holds the last tile's
        grad, columns = tiled.grads[name], tiled.params[name].shape[1]
        last = (width - 1) // columns * columns
        np.testing.assert_allclose(grad[:, :width - last], whole.grads[name][:, last:],
                                   rtol=1e-10, atol=1e-14)


def test_a_tiled_embedding_gathers_the_same_rows_per_token():
    layer = Layer(kind="embedding", hidden_size=8, vocab_size=1000)  # padded to 1,024 rows
    ex = _passes(build_executor(layer, 2, 5, tiles=8))
    assert ex.params["tokens"].shape == (128, 8) and int(ex.ids.max()) < 125
    assert ex.out.shape == (2, 5, 8)


def test_tiles_needed_is_the_fewest_that_fit():
    block = LAYERS[0]
    whole = working_set_bytes(block, 1, 4)
    assert tiles_needed(block, 1, 4, 1, 4, whole) == 1
    two = tiles_needed(block, 1, 4, 1, 4, whole - 1)
    assert two > 1 and working_set_bytes(block, 1, 4, tiles=two) < whole
    assert working_set_bytes(block, 1, 4, tiles=two // 2) > whole - 1
    assert tiles_needed(block, 1, 4, 1, 4, 1.0) is None  # its activations alone are over


TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                 ffn_hidden_size=256, vocab_size=1024, seq_length=16, mlp="swiglu",
                 norm="rmsnorm", bias=False)


def test_a_profile_under_a_low_ceiling_measures_tiles_at_full_work(monkeypatch):
    monkeypatch.setattr(profiler, "MAX_PROFILE_BYTES", 450_000)
    prof = profile_model(TINY, repeats=3, budget_s=5.0)
    assert prof.environment["memory_ceiling_gib"] == pytest.approx(450_000 / 2**30)
    for timing in prof.layers:
        assert timing.scaled == 1.0 and timing.fwd_s > 0  # the full work, nothing scaled
    embedding, block, head = prof.layers[0], prof.layers[1], prof.layers[-1]
    assert "embedding table in" in embedding.measured_at
    assert "weights in" in block.measured_at and "weights in" in head.measured_at


def test_a_layer_over_the_ceiling_at_one_token_is_refused_before_measuring(monkeypatch):
    monkeypatch.setattr(profiler, "MAX_PROFILE_BYTES", 10_000)
    monkeypatch.setattr(profiler, "probe_speed", lambda *a: pytest.fail("measured"))
    with pytest.raises(PlanInputError, match="memory ceiling of 0.00 GiB even at one token"):
        profile_model(TINY)


@pytest.mark.parametrize("args", [["--micro-batch", "1000000"], ["--seq-len", "16777216"],
                                  ["--micro-batch", "2", "--seq-len", str(MAX_PROFILE_TOKENS)]])
def test_tokens_past_the_cap_are_one_line_before_any_work(monkeypatch, args):
    monkeypatch.setattr(profiler, "probe_speed", lambda *a: pytest.fail("measured"))
    result = CliRunner().invoke(app, ["profile", "llama3-8b", *args])
    assert result.exit_code == 2, result.output
    assert "tokens; plan profile measures at most 1,048,576 tokens a micro-batch" in result.output
    assert len(result.output.strip().splitlines()) == 1


LLAMA3_405B_BLOCK = """
import resource, sys
import planner.api as api
from planner.core.limits import MAX_PROFILE_BYTES
from planner.profiling.executors import build_executor
from planner.profiling.profiler import tiles_needed
block = next(layer for layer in api.model("llama3-405b").layers if layer.kind == "block")
tiles = tiles_needed(block, 1, 16, 1, 4, MAX_PROFILE_BYTES)
ex = build_executor(block, 1, 16, tiles=tiles)
ex.forward(); ex.backward_input(); ex.backward_weight()
print(tiles, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_a_llama3_405b_block_runs_within_the_ceiling():
    # its weights and gradients alone are 24 GiB; held as tiles, the three passes at 16 tokens
    # (~0.3 TFLOP) run in one process that stays under 2 GiB
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", LLAMA3_405B_BLOCK], capture_output=True,
                          text=True, timeout=300, check=True)
    tiles, peak = map(int, done.stdout.split())
    assert tiles == 32 and peak < 2 * 2**30
