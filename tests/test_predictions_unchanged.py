"""Every validation case's prediction is what tests/golden/validation_predictions.json stored
(tools/prediction_snapshot.py): a refactor moves no number unless its commit rewrites the file.
The stored values are the model's own; their agreement with published runs is test_validate's."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import prediction_snapshot  # noqa: E402


def test_no_validation_prediction_moved():
    stored = json.loads(prediction_snapshot.SNAPSHOT.read_text())
    assert len(stored) == 82
    assert prediction_snapshot.moved(stored, prediction_snapshot.predictions()) == []


def test_the_check_sees_a_moved_number():
    stored = {"a": {"predicted_step_s": 1.0, "configuration": "tp1"}}
    assert prediction_snapshot.moved(stored, {"a": {"predicted_step_s": 1.0, "configuration": "tp1"}}) == []
    assert prediction_snapshot.moved(stored, {"a": {"predicted_step_s": 1.01, "configuration": "tp1"}})
    assert prediction_snapshot.moved(stored, {}) == ["a"]
