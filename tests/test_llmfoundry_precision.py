"""The llm-foundry MPT rows (profiles/validation/modern_runs.json, llmfoundry-*) reduce their
FSDP gradients in the dtype their README row's "MP Mode" sets, where the sources settle it.

Composer's get_mixed_precision maps ``mixed_precision: PURE`` to "param_dtype =
_get_torch_dtype(precision) reduce_dtype = _get_torch_dtype(precision) buffer_dtype =
_get_torch_dtype(precision)" in every stored version (mosaicml/composer
composer/trainer/mosaic_fsdp_utils.py at 0099561e6d40b233affd54d420d4e3582e9cacd8, and the earlier
torch-1.13-era and later versions): bf16, 2 bytes a gradient. DEFAULT is not settled: the stored
versions give it three meanings (bf16 gather and reduce at 0099561e; bf16 gather, fp32 reduce
later; fp32 gather, bf16 reduce in the torch 1.13 era) and the Composer pin of llm-foundry 061f2c7
is not stored, so those rows keep the stack's bf16 gather and fp32 reduce."""

from planner.fidelity.cases import MODERN_FILE, case_setup, load_cases
from planner.predict.step import predict_plan
from planner.stack import with_overrides

BF16_BYTES, FP32_BYTES = 2, 4  # torch.bfloat16 / torch.float32 element sizes


def _foundry_cases():
    return [c for c in load_cases(MODERN_FILE) if c["name"].startswith("llmfoundry-")]


def test_every_foundry_row_reduces_in_its_mp_mode_dtype():
    """PURE rows (the README's 'bf16 | PURE' tables) move 2 bytes per gradient in the
    reduce-scatter; DEFAULT rows keep the stack's fp32 (unsettled, see the module docstring);
    both gather 16-bit weights. The 14 rows: 5 PURE, 9 DEFAULT."""
    seen = {"PURE": 0, "DEFAULT": 0}
    for case in _foundry_cases():
        mode = "PURE" if "MP mode PURE" in case["config"]["precision"] else "DEFAULT"
        assert "MP mode " + mode in case["config"]["precision"]
        seen[mode] += 1
        opts = case_setup(case).options
        expected = BF16_BYTES if mode == "PURE" else FP32_BYTES
        assert opts.reduced_grad_bytes(3) == expected, case["name"]
        assert opts.param_dtype == "bf16"  # both modes: param_dtype = the autocast dtype
        prov = case["provenance"]["stack"]
        # the kernel its attn_impl names is priced (tests/test_attention_kernel.py)
        assert "not priced" in prov and "llm-foundry" in case["components"]
    assert seen == {"PURE": 5, "DEFAULT": 9}


def test_a_bf16_reduce_shortens_the_pure_row_it_applies_to():
    """On the 128-GPU A100-40GB MPT-70B row (PURE, one micro-batch a step, 25 GB/s per GPU
    across nodes) the bf16 reduce-scatter moves half the bytes of an fp32 one: the predicted
    step is shorter, and by less than the whole fp32 reduce-scatter of the model's gradients
    over 25 GB/s (65e9 parameters x 4 bytes x 127/128 / 25e9 B/s = 10.3 s)."""
    case = next(c for c in _foundry_cases()
                if c["name"] == "llmfoundry-mpt70b-a100_40gb-128gpu-seq2048")
    setup = case_setup(case)
    fp32 = with_overrides(setup.options, "test", grad_reduce_dtype=None)
    assert fp32.reduced_grad_bytes(3) == FP32_BYTES
    _, bf16_pred = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                                simulated=True)
    _, fp32_pred = predict_plan(setup.model, setup.cluster, setup.parallel, fp32,
                                simulated=True)
    saved = fp32_pred.step_s - bf16_pred.step_s
    assert saved > 0
    assert saved < 64.862e9 * FP32_BYTES * 127 / 128 / 25e9
