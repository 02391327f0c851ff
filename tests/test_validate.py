"""Fidelity against published training runs (planner/fidelity/published.py): a regression in the cost model
that moves the predictions away from what was measured fails here.

The pinned values are today's results (see the README's validation table); the tolerances let
harmless refactors through but not a loss of fidelity. Issue targets not yet reached are pinned at
today's value and marked as such, so an improvement shows up as an easy tightening.
"""

import pytest

from planner.fidelity.cases import DEFAULT_FILE, MODERN_FILE, case_setup, load_cases
from planner.fidelity.published import spearman, summarize, validate_cases, validate_file
from planner.report.validation import cases_table, groups_table, summary_lines, validation_markdown


@pytest.fixture(scope="module")
def result():
    rows = validate_cases(load_cases(DEFAULT_FILE))
    return rows, summarize(rows)


def test_every_case_is_evaluated_or_explicitly_skipped(result):
    rows, s = result
    assert s.cases == 41
    assert s.evaluated == 41  # ZB-2p runs as zb-2p since #15 (it was skipped before)
    assert not s.skipped
    assert all(r.note.startswith("skipped") for r in rows if not r.supported)


def test_zero_bubble_2p_runs_within_eight_percent(result):
    """Qi et al. 2023 Table 4's ZB-2p runs (1.5B on 8 GPUs, 14.6B on 16) as zb-2p with the
    fork's optimizer post-validation: predicted within 8% of the published step (measured
    +0.8% to +7.9% when it landed; the bound is that, rounded up)."""
    rows, _ = result
    zb2p = [r for r in rows if "ZB-2p" in r.case]
    assert len(zb2p) == 6 and all(r.supported for r in zb2p)
    assert all(abs(r.time_error) <= 0.08 for r in zb2p), [(r.case, r.time_error) for r in zb2p]


def test_step_time_error(result):
    _, s = result
    assert s.mean_abs_time_error <= 0.10  # issue target: mean |error| <= 10%
    # 4.0% since BLOOM's synchronous kernel launches are priced (CUDA_LAUNCH_BLOCKING=1 in its
    # slurm script; cost/host.py, host_s_per_block in the BLOOM cases, issue #15): its six rows
    # moved from -11.6..-25.2% to -0.5..-3.7%. Issue target: mean <= 5%.
    assert s.mean_abs_time_error <= 0.05
    assert s.mean_abs_time_error == pytest.approx(0.040, abs=0.005)
    # issue target: no case worse than 25%, MISSED since issue #15's DeepSpeed pipeline p2p.
    # The worst case is BLOOM's TP8/DP4 run, 26.2% slower than predicted (20.9% before, 19.2%
    # before the NICs ran at their measured 0.95 of line rate, constants.NIC_EFFICIENCY). The
    # deepspeed stack now sends 1/tp of a stage output per GPU and all-gathers it over the TP
    # group (PipelineEngine is_pipe_partitioned, p2p_scatter_gather), blocking both ranks
    # (p2p_blocking, pipeline/blocking.py): the TP8 run's p2p fell from 4 x 20 ms whole-tensor
    # transfers per microbatch as latency to 4 x 3 ms inside the ops. Whole tensors with
    # blocking would read 11.5% here; the engine's source says they are partitioned.
    # 25.2% since two DeepSpeed mechanisms are priced (issue #15): the tied embedding's gradient
    # all-reduce between the first and last stage (cost/tied_embedding.py, +0.30 s on this TP8
    # run) and BF16_Optimizer's all-reduce of the fp32 gradients at ZeRO-1 (deepspeed stack
    # zero1_grad_reduce, +1.0 s).
    # 9.6% (megatron-readme-gpt3-175B) since BLOOM's synchronous launches are priced
    # (cost/host.py): the TP8/DP4 run's per-block host time is twice the TP4 runs' per step (twice
    # the microbatches), which is what made it 19% slower than them; it reads -1.5% now. Issue
    # target met: no case worse than 15%.
    assert s.max_abs_time_error <= 0.15
    assert s.max_abs_time_error == pytest.approx(0.096, abs=0.01)


def test_every_case_names_its_stack_and_the_old_set_is_no_worse(result):
    """Issue 14: cases name the stack they ran on (no choice by group prefix), and pricing them
    on their stacks keeps the old set's mean |error| at 6.07%, its value before stacks (the
    bound is that measured value, so any loss of fidelity fails)."""
    from planner.stack import bundled_names
    rows, s = result
    for case in load_cases(DEFAULT_FILE) + load_cases(MODERN_FILE):
        assert case["stack"] in bundled_names(), case["name"]
    assert all(r.stack for r in rows)
    bloom = {r.case: r for r in rows}["bloom-176B-production"]
    assert bloom.stack.startswith("deepspeed") and "bigscience-tr11" in bloom.stack  # unfused
    # 6.07% before; 6.30% since the NICs run at their measured 0.95 of line rate (issue #15,
    # constants.NIC_EFFICIENCY): BLOOM's Omni-Path transfers got faster, its rows 1.2-1.7 points
    # further under; Megatron's DP-bound Table 1 rows improved. 6.39% since DeepSpeed's pipeline
    # transfers are TP-partitioned and blocking (deepspeed stack p2p_scatter_gather,
    # p2p_blocking; issue #15): BLOOM's six rows 2-5 points further under. 6.15% since the tied
    # embedding's gradient all-reduce (cost/tied_embedding.py) and BF16_Optimizer's ZeRO-1
    # all-reduce (deepspeed stack zero1_grad_reduce) are priced: BLOOM's rows 1.0-1.8 points
    # closer, the interleaved Megatron Table 1 rows by under 0.1.
    # 3.98% since BLOOM's synchronous kernel launches are priced (cost/host.py, issue #15).
    assert s.mean_abs_time_error <= 0.0410


def test_groups_outside_bloom_are_within_twelve_percent(result):
    rows, _ = result
    for r in rows:
        if r.supported and not r.group.startswith("bloom"):
            assert abs(r.time_error) <= 0.12, r.case


def test_memory_error(result):
    rows, s = result
    assert s.memory_cases == 29  # 23 before the six ZB-2p runs were evaluated
    # zero-bubble Table 4: never under-estimated by more than 3% (issue target), over <= 15%
    zb = [r.memory_error for r in rows if r.group == "zero_bubble_table4" and r.supported]
    assert min(zb) >= -0.03 and max(zb) <= 0.15
    # BLOOM (nvidia-smi, full recompute): never under-estimated by more than 3% (issue target);
    # the margin is thin (-1.9 .. -2.9% today, see the fragmentation share in planner/cost/constants.py).
    # Over-estimating is allowed: only running out of memory that the plan promised is a failure.
    bloom = [r.memory_error for r in rows if r.group.startswith("bloom") and r.supported
             and r.memory_error is not None]
    assert len(bloom) == 5 and min(bloom) >= -0.03
    assert s.min_memory_error == pytest.approx(-0.029, abs=0.005)
    assert s.max_memory_error <= 0.15


def test_speed_ranking_within_sweeps(result):
    _, s = result
    rho = dict(s.spearman)
    # 0.70 before BLOOM's synchronous launches were priced (cost/host.py); 0.90 since: the TP8
    # run is ranked slowest as measured, only the TP4 micro-batch-4 run ranks one place early.
    assert rho["bloom_sweep_0228"] >= 0.8  # issue target
    assert rho["bloom_sweep_0228"] == pytest.approx(0.9)
    assert rho["zero_bubble_table4:1.5B"] >= 0.8
    assert rho["zero_bubble_table4:14.6B"] >= 0.7


def test_no_published_run_is_predicted_out_of_memory(result):
    assert result[1].oom_mismatches == ()


def test_tflops_follow_the_sources_definition(result):
    rows, _ = result
    by_name = {r.case: r for r in rows}
    assert by_name["megatron2021-table1-1.7B"].tflops_definition == "hardware"
    assert by_name["bloom-176B-production"].tflops_definition == "hardware"


def test_documented_assumptions():
    cases = {c["name"]: c for c in load_cases(DEFAULT_FILE)}
    readme = case_setup(cases["megatron-readme-gpt3-175B-1024gpu"])
    assert readme.parallel.schedule == "1f1b" and readme.parallel.micro_batch == 1
    table1 = case_setup(cases["megatron2021-table1-145.6B"])
    assert table1.parallel.schedule == "interleaved" and table1.parallel.virtual_stages == 2
    assert not table1.options.flash_attention and not table1.options.overlap_grad_reduce
    bloom = case_setup(cases["bloom-176B-production"])
    assert bloom.model.position_embeddings == 0 and bloom.model.vocab_size == 250880
    assert bloom.bounds[0] == (0, 6) and bloom.parallel.zero == 1  # embedding + 5 blocks
    zb = case_setup(cases["zerobubble-1.5B-1F1B-I-m24"])
    assert zb.parallel.virtual_stages == 3 and zb.model.vocab_size == 51200
    assert any("unpublished" in n for n in zb.notes)


def test_spearman_ranks_ties_and_reversals():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.866, abs=1e-3)


def test_renderings(result):
    rows, s = result
    md = validation_markdown(rows, s)
    assert sum(line.startswith("| ") for line in md.splitlines()) == len(rows) + 1  # + header
    assert "| megatron2021-table1-1.7B |" in md and "Spearman" in md
    assert cases_table(rows).row_count == len(rows)
    assert groups_table(rows).row_count == len({r.group for r in rows if r.time_error is not None})


# --- both files: old (2020-23, unfused attention) and modern (flash, FSDP, torchtitan) ----------


@pytest.fixture(scope="module")
def both():
    return validate_file()


def test_default_validation_reads_both_files_and_summarises_each(both):
    rows, s = both
    assert {r.dataset for r in rows} == {"old", "modern", "moe"}
    groups = dict(s.groups)
    assert (groups["old"].cases, groups["old"].evaluated) == (41, 41)
    # modern: none skipped since issue #18's FSDP2 Float8 pass priced torchtitan's three Float8
    # runs (FP8 all-gather, weights and gradients held through the step under PP, AsyncTP's
    # hidden share: cost/zero.py, the stack's fields); FP8 itself is priced
    # (cost/precision.py), the CP rows (cp=16, cp=2) too (cost/context.py), and the
    # torch.compile runs are evaluated on their stack with fused element-wise kernels
    # (cost/elementwise.py)
    assert (groups["modern"].cases, groups["modern"].evaluated) == (34, 34)
    assert groups["modern"].skip_reasons == ()
    # moe: 7 published MoE runs, all evaluated (the DeepSeek-V3 report's with DualPipe,
    # pipeline/dualpipe.py)
    assert (groups["moe"].cases, groups["moe"].evaluated) == (7, 7)
    assert groups["moe"].skip_reasons == ()
    assert (s.cases, s.evaluated) == (82, 82)
    text = "\n".join(summary_lines(s))
    assert "old:" in text and "modern:" in text and "moe:" in text and "all cases:" in text


def test_modern_step_time_error(both):
    # Issue targets (mean <= 10%, max <= 25%) are NOT met on the modern set: the model is still
    # optimistic on every FSDP run (A100 -4..-16%, H100 -17..-30%) even though overlapped
    # collectives now cost the SMs they hold (1-5 points). Two case corrections (issue #15,
    # no constant changed) moved it from 17.5% / 37.2%:
    # - Llama 3 405B (+25%, +37%, +25% -> +9%, +8%, -3%): the paper's own layout, v=8 (sec.
    #   3.3.2: the first model chunk holds only the embedding after giving up one layer, so every
    #   chunk is one layer), not the smallest interleaving v=2; the bubble (p-1)/(v·M) falls 4x.
    #   Recompute is still guessed full (without it the 8K rows read -18% and do not fit; with
    #   one block per chunk Megatron's block method has no count between none and full).
    # - torchtitan's Grand Teton H100s (-27..-30% -> -21..-25%): their published 2.4 TB/s HBM2e
    #   (case field hbm_GBps), not the SXM profile's 3.35 TB/s HBM3.
    # Partial recompute (Megatron's block method, predict/chunks.py partial_segments) moved
    # NeMo's GPT-3 175B FP8 row from +33% (every block recomputed) to +17%: its unpublished
    # recompute was guessed as the least block count that fits, the first of each chunk's 2
    # blocks. (Its recipe was found since: no recompute, see test_fp8_runs_are_summarised_apart.)
    # Modern 14.6% / 32.8% -> 14.1% / 29.8% (the worst row now llm-foundry MPT-13B on H100).
    # Pinned at today's values so an improvement shows up as an easy tightening.
    # Issue #18's FSDP2 Float8 pass added torchtitan's three Float8 rows (70B 2D -8.0%; 405B 3D
    # 1F1B -17.7%, interleaved -29.5%: optimistic like the other Grand Teton rows, whose 500 W
    # H100s run below the SXM peak the model prices): mean 14.1% -> 14.5%, max unchanged.
    # The llm-foundry MPT rows priced on the Triton FlashAttention they ran (stack
    # attention_kernel flash_triton, cost/attention_kernel.py: FlashAttention-2 paper sec. 4.1,
    # forward 1.3x, backward 2x FlashAttention-2's time): A100 -4.3..-16.4% -> -2.1..-13.6%,
    # H100 -16.8..-29.8% -> -11.7..-26.5%, all still optimistic. Modern 14.5% / 29.8% ->
    # 13.1% / 28.5%; all cases 9.5% -> 8.9%.
    # Those 500 W H100s are now priced at their power limit (hardware/power.py: the tensor peak
    # falls as P^0.30, read from the H100 SXM and NVL datasheet points, 989 -> 894 TFLOP/s): the
    # seven Grand Teton rows move 4-6 points (bf16 -21..-25% -> -16..-19%). With both: modern
    # 12.0% / 26.5% (MPT-13B on H100 the worst again), all cases 8.4%.
    # The NeMo 24.07 FP8 rows pinned to their launcher recipes (issue #15: no recompute, TP
    # overlap on GPT-3 175B and Llama 3 70B, FP8 primary weights on GPT-3 175B, bf16 gradient
    # buffers where grad_sync_dtype=bf16; test_fp8_runs_are_summarised_apart) and the hidden TP
    # share paying the SMs it holds (cost/layer.py): modern 12.02% -> 12.2%, max unchanged,
    # all cases 8.4% -> 8.5%.
    # TE userbuffer overlap priced per collective from each run's ub_cfgs (cost/tp_overlap.py,
    # replacing megatron-core's unsourced hidden share 1.0): the GPT-3 175B and Llama 3 70B
    # NeMo rows -16.2% -> -15.5% and -13.3% -> -10.0%: modern 12.2% -> 12.1%, all cases 8.4%.
    # The torchtitan 405B interleaved row run on torch's lockstep time steps, as its Dec 2024
    # torch ran Interleaved1F1B (Stack.pipeline_timesteps, pipeline/timestep.py): -24.4% ->
    # -22.7%, modern 12.1% -> 12.0% (12.04%).
    # Both 405B rows with their Dec 2024 torch's FSDP2 reduce-scatters inside each stage's last
    # backward, unit after unit, before the input gradient is sent (Stack.zero3_reduce_chain,
    # cost/zero.py reduce_chain_s): 1F1B -11.6% -> -4.1%, interleaved -22.7% -> -13.8%; modern
    # 12.0% -> 11.6%: the issue target (<= 12%) is met.
    _, s = both
    modern = dict(s.groups)["modern"]
    assert modern.mean_abs_time_error == pytest.approx(0.116, abs=0.005)
    assert modern.mean_abs_time_error <= 0.12
    assert modern.max_abs_time_error == pytest.approx(0.265, abs=0.02)
    assert s.mean_abs_time_error == pytest.approx(0.084, abs=0.01)  # with the MoE rows


def test_moe_step_time_error(both):
    # The MoE rows (cost/moe.py, no constant fitted to them): mean 17%, max 27% (21% and 33%
    # before issue #18's second MoE pass). Moved by: the Megatron Qwen3-235B rows' dropless
    # expert load (1.43, derived from the same readme's forced-balance/dropless pairs,
    # tests/test_moe_load.py), DeepEP sending a token once per rank and node that holds its
    # experts (cost/routing.py), and the Automodel rows' round-robin FakeBalancedGate (a token
    # meets one node) and own dtypes. Per row: Qwen3-235B EP32 +12.5% (the EP8-derived load
    # over-prices this cross-node DeepEP row), EP8 a2a -16%, EP8 TP4 -26.5% (still optimistic:
    # host overhead and small grouped GEMMs not priced); Automodel Qwen3-30B -7%, DeepSeek-V3
    # 256 / 1024 GPUs -16% / -25% (their expert FSDP and reshard_after_forward: false not
    # modelled). Pinned so an improvement shows up as a tightening.
    _, s = both
    moe = dict(s.groups)["moe"]
    # With the DeepSeek-V3 report's row evaluated on DualPipe (+7.1%, pipeline/dualpipe.py)
    # the seven rows read mean 15.7%, max 26.5% (16.2% with its MLA up-projection recompute
    # and MTP module, tests/test_deepseek_v3_memory.py). Issue #18's FSDP2 pass moved the two
    # Automodel DeepSeek-V3 rows (pp4 on the torchtitan stack) to -16.9% / -31.2%: under
    # torch.distributed.pipelining FSDP2 stages are gathered and reduce-scattered once a step
    # (zero3_pipeline_hold, cost/zero.py), not per microbatch: mean 17.3%, max 31.2%; 16.9%
    # with the DeepSeek-V3 report row on DeepSeek's stage split (+10.4% -> +7.8%).
    # The MoE pass on the Qwen3 sweep: an MoE block's MLP has no dense-TP pair under
    # Megatron-Core (its dispatcher runs on the SP shard; cost/moe.py block_tp_pairs), which
    # speeds the three TP rows (EP32 +11.2%, EP8 a2a -16.7%, EP8 TP4 -29.7%); the Automodel
    # DeepSeek-V3 row on 1,024 GPUs runs its pipeline once per local batch, four times a step
    # (LBS 8, GA 4: cases.local_batch_passes): -31.2% -> -28.5%. Mean 16.9%, max 29.7%.
    assert moe.mean_abs_time_error == pytest.approx(0.169, abs=0.02)
    assert moe.max_abs_time_error == pytest.approx(0.297, abs=0.03)
    # No MoE run that ran is predicted out of memory but the DeepSeek-V3 report's row
    # (test_the_deepseek_v3_report_row_runs_dualpipe): the Automodel Qwen3-30B row, at the
    # torchtitan stack's fp32 master, gradients and Adam beside fp32 cross-entropy buffers once
    # 112 GiB, is priced on its own bf16 parameters, Adam states, gradients and loss (62 GiB).
    # Issues #15/#18 memory pass: torch.distributed.pipelining's receive buffers, one per
    # microbatch and direction for the whole pipeline pass (stack p2p_buffers_per_microbatch;
    # NeMo Automodel pull request #3780: "pre-allocates one full-size P2P recv buffer per
    # microbatch and per direction ... At large microbatch counts this dominates stage
    # memory") add 4.6 GiB to both Automodel DeepSeek-V3 rows (8 microbatches a pass through 8
    # stages a rank); under full recompute they still fit (76.0 and 73.1 GiB).
    # Issue #15 (DeepSeek-V3 weights): the report's row holds its linear weights once, in FP8
    # with their transposes (report sec. 3.3.1, Figure 6; the case's fp8_params), not a BF16
    # weight and Transformer Engine's FP8 cache beside it: 83.1 -> 76.4 GiB, it fits
    # (tests/test_deepseek_v3_memory.py). No run that ran is predicted OOM.
    assert moe.oom_mismatches == ()


def test_modern_memory(both):
    # Issue target met where memory was published (torchtitan H100, 8 and 128 GPUs, eager and
    # compiled): never under-estimated; eager then +1.6% at 8 and 128 GPUs, compiled +8.7% / +9.8%
    # (higher since the reserve pass below).
    # The compiled rows read 5.0-5.4 GiB below eager at the same configuration, which is not in
    # the tensors held: torchtitan's default selective AC (train_configs/llama3_8b.toml
    # selective_ac_option = 'op') saves the outputs of mm and SDPA only and recomputes the norms
    # and SwiGLU in both modes, and the peak is the loss's backward, before any block's; so it
    # is the allocator's reserve again (eager's many temporaries; torchtitan PR #165 measured a
    # compiled full-AC run's reserved peak 28.72 GiB against eager's 32.64% of 95.04 GiB, 7%
    # less). No run that ran is predicted out of memory: where recompute is
    # unpublished and none would not fit (Llama 3 405B, 8,192 GPUs), the guess is the least
    # recompute that fits: full, since its chunks hold one block each (no block count between).
    # Issue #18 added torchtitan's three Float8 rows (reserved peak, GiB), priced with FSDP2's
    # FP8 all-gather, loss parallel's fp32 buffers (cost/loss.py), DTensor SP's kept gathered
    # inputs, the stage's FP8 weights and fp32 gradients held unsharded through the step
    # (zero3_pipeline_hold) and the torchtitan microbatch defaults (8 of 4, 16 of 2).
    # Issues #15/#18 memory pass (moved every torchtitan row; each mechanism sourced in place):
    # - the readings are torchtitan's max_reserved, the caching allocator's reserve, which holds
    #   neither the CUDA context nor NCCL's buffers: compared less RESERVED_BYTES
    #   (measured.memory_scope "allocator", fidelity/published.py): every row -2 GiB;
    # - eager cross-entropy peaks at three fp32 logit buffers, not three and the 16-bit
    #   gradient (cost/loss.py): 8B rows about -4 GiB (eager 8 GPUs +9.3% -> +1.6%);
    # - torch.distributed.pipelining keeps a receive buffer per microbatch and direction
    #   (stack p2p_buffers_per_microbatch): 405B rows +1 / +2.5 GiB;
    # - under SP one of a block's two hidden-size backward gradients is whole (cost/memory.py
    #   working_bytes): 405B rows +1 / +0.5 GiB.
    # The three Float8 rows read 70B -3.7%, 405B 1F1B -8.8%, interleaved -5.4% then (under
    # the invariant); torchao's FP8 backward operand layouts (cost/fp8_backward.py: the output
    # gradient in e5m2 and transposed, the saved input and the weight column-major) moved the
    # 405B rows' block-backward peaks to -7.0% / -4.4%.
    # Issue #15 reserve pass (the readings are the caching allocator's reserve), two FSDP2
    # mechanisms, each sourced in place:
    # - ZeRO-3's root unit (embedding, final norm, head) stays gathered from forward to
    #   backward while the blocks are gathered in turn (cost/zero.py root_unit_held): the
    #   gathered transient is the largest block's, the root's layers are held;
    # - what FSDP2's side streams free stays reserved for them (cost/side_streams.py): the
    #   all-gather outputs in flight and, where a stage's gradients are held unsharded, the
    #   sharded gradients' blocks; counted as measured, not in what must fit.
    # Float8 rows: 70B -3.7% -> -2.7%, 405B 1F1B -7.0% -> -2.0%, interleaved -4.4% -> +1.2%.
    # The 8B rows rise to +6.0..+6.2% eager and +13.6..+14.5% compiled (the root's embedding
    # and head, 1.05 GB each in 16-bit, held beside the loss's buffers and reserved again on
    # the copy-in stream).
    rows, s = both
    modern = dict(s.groups)["modern"]
    assert modern.memory_cases == 7
    by_case = {r.case: r for r in rows}
    assert by_case["torchtitan-llama3.1-405b-512gpu-3d-1f1b-float8"].memory_error == \
        pytest.approx(-0.020, abs=0.005)
    assert by_case["torchtitan-llama3.1-405b-512gpu-3d-interleaved-float8"].memory_error == \
        pytest.approx(0.012, abs=0.005)
    assert by_case["torchtitan-llama3.1-70b-256gpu-fsdp32-tp8-float8"].memory_error == \
        pytest.approx(-0.027, abs=0.005)
    assert modern.min_memory_error >= -0.03 and modern.max_memory_error <= 0.15
    assert modern.oom_mismatches == ()
    llama = {r.case: r for r in rows}["llama3-405b-paper-8192gpu-tp8-cp1-pp16-dp64-seq8192"]
    assert " full " in llama.configuration and "none would not fit" in llama.note


def test_modern_setups():
    cases = {c["name"]: c for c in load_cases(MODERN_FILE)}
    mpt = case_setup(cases["llmfoundry-mpt7b-a100_80gb-8gpu-seq2048"])
    assert mpt.parallel.zero == 3 and mpt.options.flash_attention
    assert mpt.options.overlap_grad_reduce
    assert not mpt.model.dropout and mpt.model.tie_embeddings
    assert mpt.cluster.hardware.matmul_efficiency == pytest.approx(0.859)
    titan = case_setup(cases["torchtitan-llama3-8b-a100-64gpu-fsdp2-lbs1-ac_selective-op"])
    # torchtitan's op-level selective AC, priced as its policy runs (cost/recompute.py)
    assert titan.options.recompute_modules == ("torchtitan_op",)
    assert not titan.options.fused_cross_entropy
    h100 = case_setup(cases["llmfoundry-mpt7b-h100_80gb-8gpu-seq2048"])
    assert h100.cluster.hardware.attention_efficiency == pytest.approx(0.35)
    assert h100.cluster.hardware.memory_bandwidth_gbps == 3350
    # torchtitan's Grand Teton H100s: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth"
    teton = case_setup(cases["torchtitan-llama3.1-8b-8gpu-fsdp"])
    assert teton.cluster.hardware.memory_bandwidth_gbps == 2400
    assert teton.cluster.hardware.matmul_efficiency == pytest.approx(0.801)  # the H100 profile's
    # Llama 3 405B: 126 layers + embedding + head over 16 ranks x 8 chunks, one layer a chunk
    llama = case_setup(cases["llama3-405b-paper-16384gpu-tp8-cp1-pp16-dp128-seq8192"])
    assert (llama.parallel.schedule, llama.parallel.virtual_stages) == ("interleaved", 8)
    assert len(llama.model.layers) == llama.parallel.pp * llama.parallel.virtual_stages
    nemo = case_setup(cases["nemo2407-llama2-7b-h100-8gpu-tp1-pp1-cp1-vp1-fp8"])
    assert not nemo.unsupported and nemo.options.precision == "fp8"
    assert nemo.options.fp8_recipe == "delayed"  # Transformer Engine's default under NeMo


def test_fp8_runs_are_summarised_apart(both):
    # The FP8 runs (NeMo 24.07 on DGX-H100, Transformer Engine delayed scaling) priced with FP8
    # GEMMs: mean |error| 7.3% (GPT-3 175B +17.4% with its unpublished recompute guessed as
    # Megatron's block method, 1 of each chunk's 2 blocks: +33% with both,
    # Llama 2 70B +3.1%, Llama 2 7B -6.9%, and since context parallelism is priced the Llama 3
    # 70B cp=2 row +4.1%). Priced as BF16 the first three are +101%, +44%, +32% (mean 59%).
    # Pinned at today's values.
    rows, s = both
    fp8 = dict(s.groups)["fp8 runs"]
    # 8 cases, 5 evaluated: the DeepSeek-V3 report's FP8 MoE run (moe_runs.json) is priced since
    # DualPipe is (pipeline/dualpipe.py: +7.1%; the group's mean moved 11.2% -> 10.4%; the
    # block-method guess for GPT-3 175B then 10.4% -> 7.3%; the DeepSeek-V3 row's MLA
    # up-projection recompute and MTP module, +7.1% -> +10.4%, then 7.9%)
    assert (fp8.cases, fp8.evaluated) == (8, 5 + 3)
    # + torchtitan's three Float8 rows (issue #18, FSDP2 pass): -8.0%, -17.7%, -29.5%: the
    # group's mean 8.1% -> 12.0%; 11.7% with the DeepSeek-V3 row on DeepSeek's stage split
    # (+10.4% -> +7.8%, test_the_deepseek_v3_report_row_runs_dualpipe)
    # The three torchtitan rows at their 500 W power limit (hardware/power.py): -6.2% -> -1.7%,
    # -16.5% -> -11.3%, -28.5% -> -24.2%; the group's mean 11.2% -> 9.4%.
    # Issue #15: the NeMo rows pinned to their recipes (NeMo-Framework-Launcher conf/training,
    # quoted in each row's provenance) instead of guessed knobs, and FP8 primary weights priced
    # (cost/precision.py fp8_primary_weights). GPT-3 175B (175b_mlperf.yaml: no recompute, TP
    # overlap, fp8_params, bf16 grad buffer) +17.7% -> -16.2%: without recompute it fits (62 GiB)
    # only with FP8 primary weights and bf16 gradients (84 GiB without); Llama 2 70B (no TP
    # overlap, bf16 grads) +3.0% -> -1.8%; Llama 3 70B (TP overlap, bf16 grads) +4.5% -> -13.3%;
    # Llama 2 7B -5.2% (unchanged). With TP overlap off the GPT-3 and Llama 3 rows would read
    # -3.8% and +0.5%: the overlap as then priced (the stack's tp_overlap_hidden 1.0, "no published
    # fraction", less the SMs the hidden collectives hold; replaced below) hides more than these
    # runs gained.
    # The torchtitan AsyncTP rows with the SM share (and their re-derived 0.23): -11.3% ->
    # -11.6%, -24.2% -> -24.4%. The group's mean 9.4% -> 10.2%.
    # Transformer Engine's userbuffer overlap priced per collective from each row's ub_cfgs
    # (cost/tp_overlap.py; planner/stack/userbuffers.py; the recipes' tp_overlap YAMLs in the
    # rows' stack_overrides) instead of the hidden share 1.0: the pipelined reduce-scatters
    # expose their last chunk, their GEMMs give up the SMs set_sm_margin reserves (24 and 16 of
    # 132), the ring exchanges run on the copy engines. GPT-3 175B -16.2% -> -15.5%, Llama 3
    # 70B -13.3% -> -10.0%: still optimistic, not fitted; the group's mean 10.2% -> 9.7%.
    # The 405B interleaved row on the lockstep time steps its Dec 2024 torch ran
    # (Stack.pipeline_timesteps, pipeline/timestep.py): -24.4% -> -22.7%, the 1F1B row
    # (Schedule1F1B, no time steps) unchanged at -11.6%; the group's mean 9.7% -> 9.5%.
    # Both 405B rows with the reduce-scatter chain of each stage's last backward (their torch's
    # FSDP2 post-backward under pipelining: Stack.zero3_reduce_chain, cost/zero.py
    # reduce_chain_s): 1F1B -11.6% -> -4.1%, interleaved -22.7% -> -13.8%; the group's mean
    # 9.5% -> 7.5%.
    assert fp8.mean_abs_time_error == pytest.approx(0.075, abs=0.01)
    by_case = {r.case: r for r in rows}
    inter = by_case["torchtitan-llama3.1-405b-512gpu-3d-interleaved-float8"]
    one = by_case["torchtitan-llama3.1-405b-512gpu-3d-1f1b-float8"]
    # both ran torch 2.6's pipelining (time steps, the reduce-scatter chain)
    assert "torch-pipelining-2.6" in inter.stack and "torch-pipelining-2.6" in one.stack
    assert inter.predicted_step_s / inter.measured_step_s - 1 == pytest.approx(-0.138, abs=0.01)
    assert one.predicted_step_s / one.measured_step_s - 1 == pytest.approx(-0.041, abs=0.01)
    by = {r.case: r for r in rows}
    gpt3 = by["nemo2407-gpt3-175b-h100-512gpu-tp4-pp8-cp1-vp6-fp8"]
    assert gpt3.configuration.endswith(" none ZeRO-1") and not gpt3.predicted_oom
    assert "FP8 primary weights" in gpt3.note and "TP overlap" in gpt3.note
    assert gpt3.predicted_step_s / gpt3.measured_step_s - 1 == pytest.approx(-0.155, abs=0.01)
    for name, error in (("nemo2407-llama2-70b-h100-64gpu-tp4-pp4-cp1-vp20-fp8", -0.018),
                        ("nemo2407-llama3-70b-h100-64gpu-tp4-pp4-cp2-vp5-fp8", -0.100),
                        ("nemo2407-llama2-7b-h100-8gpu-tp1-pp1-cp1-vp1-fp8", -0.052)):
        row = by[name]
        assert row.predicted_step_s / row.measured_step_s - 1 == pytest.approx(error, abs=0.01)
        assert " none ZeRO-1" in row.configuration and "recompute unpublished" not in row.note
    assert all(r.precision == "fp8" and "precision=fp8" in r.stack
               for r in rows if r.case.endswith(("-fp8", "-float8")))


def test_the_torchtitan_eager_compile_pair_is_reproduced(both):
    """torchtitan's performance table measures Llama 3.1 8B with and without torch.compile on
    the same H100s (8 and 128 GPUs): compiled is 1.157x and 1.162x faster. The eager element-
    wise kernels (fp32 RMSNorm, RoPE, SwiGLU in two, GQA copies; cost/elementwise.py) are the
    difference the model sees, less the RoPE, which compile leaves eager (torchtitan's RoPE is
    complex arithmetic, which inductor cannot fuse: Stack.complex_rope); it predicts the ratio
    within 3%."""
    rows, _ = both
    by = {r.case: r for r in rows}
    for gpus in (8, 128):
        eager = by[f"torchtitan-llama3.1-8b-{gpus}gpu-fsdp"]
        compiled = by[f"torchtitan-llama3.1-8b-{gpus}gpu-fsdp-compile"]
        assert "fused_elementwise=on" in compiled.stack and "fused" not in eager.stack
        measured = eager.measured_step_s / compiled.measured_step_s
        predicted = eager.predicted_step_s / compiled.predicted_step_s
        assert measured == pytest.approx(1.16, abs=0.01)
        # Priced as torchtitan's op SAC (cost/recompute.py) the backward re-runs every
        # element-wise op, eager ones in eager's bytes, which moved the ratio to 1.226 / 1.227
        # (+5.9% / +5.6%) while the compiled RoPE was priced fused; with compile's RoPE left
        # eager (its complex multiply has no inductor code, cost/elementwise.py) it is 1.175 /
        # 1.175 (+1.5% / +1.2%). Without the RoPE mechanism it would read ~1.23.
        assert predicted == pytest.approx(measured, rel=0.03)
        assert predicted < 1.2


def test_the_deepseek_v3_report_row_runs_dualpipe(both):
    """The DeepSeek-V3 report's 2,048-H800 run (PP 16, EP 64, DualPipe; step time derived from
    its GPU-hours) is evaluated on the DualPipe schedule (pipeline/dualpipe.py): +7.1% when
    this mechanism landed (as 1F1B, with its all-to-all exposed, the prediction is 31.7 s,
    +59%); +7.6% with the report's recompute of the MLA up-projections (their GEMMs run again
    in the backward, cost/recompute.py), +10.4% with its MTP module on the last stage (a block,
    a projection and a second output head and loss on DualPipe's ranks 0 and 15, cost/mtp.py);
    +7.8% on DeepSeek's stage of 4 MoE layers (deepseek-ai/profile-data, the case's
    stage_blocks: ranks 0 and 15 run 5 blocks beside the heads, not Megatron's even split's 7).
    +7.7% with its linear weights held once in FP8 (the case's fp8_params: the ZeRO-1 gather
    moves 1 byte a block weight, the per-step cast is unchanged); it fits the H800
    (tests/test_deepseek_v3_memory.py says by how much and why); pinned at today's value."""
    rows, _ = both
    row = next(r for r in rows if r.case == "moe-deepseek-v3-report-h800-2048gpu")
    assert "dualpipe" in row.configuration
    assert row.time_error == pytest.approx(0.078, abs=0.02)


def test_the_stored_validation_record_is_current(both):
    """`plan solve` prints the record of the runs priced on its stack and GPU from
    profiles/validation/record.json (planner/fidelity/record.py); stale when the model moved:
    `python tools/validation_record.py --write` rewrites it."""
    from planner.fidelity.holdout import held_out_file
    from planner.fidelity.record import RECORD_FILE, families, record_text
    assert RECORD_FILE.read_text() == record_text(families(both[0], held_out_file(both[0])))
