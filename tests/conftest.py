import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def published_runs():
    return json.loads((ROOT / "profiles" / "validation" / "published_runs.json").read_text())
