"""The validation record a plan prints (planner/fidelity/record.py): which runs count for a stack
and GPU, and the line that says how they came out."""

from planner.fidelity.published import ValidationRow
from planner.fidelity.record import Family, families, load_record, record_line


def _row(group, stack, hardware, measured, predicted):
    return ValidationRow(case=f"{group}-{predicted}", group=group, sweep="", configuration="",
                         measured_step_s=measured, predicted_step_s=predicted,
                         measured_tokens_per_s=1.0, predicted_tokens_per_s=None,
                         tflops_definition="model", measured_tflops=None, predicted_tflops=None,
                         measured_memory_gib=None, predicted_memory_gib=None,
                         predicted_oom=False, note="", stack_name=stack, hardware=hardware)


def test_families_group_by_source_stack_and_gpu_and_skip_unevaluated_rows():
    rows = [_row("a", "megatron-core", "h100", 10.0, 9.0),   # -10%
            _row("a", "megatron-core", "h100", 10.0, 10.5),  # +5%
            _row("a", "torchtitan", "h100", 10.0, 8.0),      # other stack: its own family
            _row("b", "megatron-core", "h100", 10.0, None)]  # skipped: not counted
    fams = families(rows)
    assert [(f.group, f.stack, f.runs) for f in fams] == [("a", "megatron-core", 2),
                                                          ("a", "torchtitan", 1)]
    assert (fams[0].min_error, fams[0].max_error, fams[0].mean_abs_error) == (-0.1, 0.05, 0.075)


def test_the_line_sums_the_sources_of_the_plans_stack_and_gpu():
    fams = (Family("a", "megatron-core", "h100", 2, -0.1, 0.05, 0.075),
            Family("b", "megatron-core", "h100", 2, -0.2, -0.1, 0.15),
            Family("c", "megatron-core", "a100", 9, -0.5, 0.5, 0.5))
    line = record_line(fams, "megatron-core", "h100")
    # 4 runs of two sources; mean |error| weighted by runs: (2 x 7.5% + 2 x 15%) / 4
    assert line.startswith("4 published runs (2 sources) priced on megatron-core with h100 came "
                           "out -20.0%..+5.0%, mean |error| 11.2%")


def test_without_runs_of_its_own_the_line_names_the_nearest_evidence_or_none():
    fams = (Family("a", "megatron-2021", "a100", 30, -0.1, 0.1, 0.05),
            Family("b", "deepspeed", "a100", 6, -0.04, 0.0, 0.02))
    line = record_line(fams, "megatron-core", "a100")
    assert line.startswith("no published run in the validation set was priced on megatron-core "
                           "with a100 (nearest: 30 runs on megatron-2021 with a100, "
                           "-10.0%..+10.0%)")
    assert "nearest" not in record_line(fams, "megatron-core", "b200")


def test_the_bundled_record_loads():
    fams = load_record()
    assert fams and all(f.runs > 0 and f.min_error <= f.max_error for f in fams)
