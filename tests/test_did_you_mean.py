"""A mistyped model, GPU or stack name is answered with the closest known one (issue #33: no
"did you mean" for --model lama3-70b), and with none when nothing is close."""

import pytest

from planner.core.errors import PlanInputError
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model
from planner.stack import load_stack


@pytest.mark.parametrize("load,typo,meant", [
    (load_model, "lama3-70b", "llama3-70b"), (load_model, "LLama3-8", "llama3-8b"),
    (load_hardware, "h10", "h100"), (load_hardware, "a100-80gbb", "a100-80gb"),
    (load_stack, "megatron-cor", "megatron-core"), (load_stack, "torchtitn", "torchtitan")])
def test_a_close_name_is_suggested(load, typo, meant):
    with pytest.raises(PlanInputError, match=f"unknown .*'{typo}' \\(did you mean '{meant}'\\?\\)"):
        load(typo)


def test_no_suggestion_when_nothing_is_close():
    with pytest.raises(PlanInputError) as err:
        load_model("zzzz")
    assert "did you mean" not in str(err.value)
