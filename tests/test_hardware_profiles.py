"""The bundled GPU profiles: every figure a profile sets has its source, each names its vendor
document, and `plan hardware` lists them with it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli import app
from planner.hardware.profiles import HARDWARE_DIR, bundled_hardware, load_hardware

NEW = ("b200", "gb200-nvl72", "h800", "h100-pcie", "mi300x", "mi325x")


@pytest.mark.parametrize("path", sorted(HARDWARE_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_figure_has_a_source(path):
    doc = json.loads(path.read_text())
    sources = doc["sources"]
    assert sources.get("datasheet")
    for key, value in doc.items():
        if key not in ("name", "sources") and value is not None:
            assert sources.get(key), f"{path.name}: '{key}' has no source"


def test_datasheet_figures():
    """Dense BF16 is half the with-sparsity figure the NVIDIA datasheets print; bandwidths per
    direction are half the bidirectional NVLink figure."""
    gpus = bundled_hardware()
    assert set(NEW) <= set(gpus)
    assert (gpus["b200"].peak_tflops, gpus["b200"].intra_node_gbps) == (36000 / 8 / 2, 1800 / 2)
    assert gpus["gb200-nvl72"].peak_tflops == 360000 / 72 / 2
    assert gpus["gb200-nvl72"].nvlink_domain == 72 and gpus["gb200-nvl72"].gpus_per_node == 4
    assert gpus["h800"].intra_node_gbps == 400 / 2 and gpus["h800"].peak_tflops == 989
    assert gpus["h100-pcie"].peak_tflops == 756 and gpus["h100-pcie"].nvlink_domain is None
    assert gpus["mi300x"].peak_tflops == gpus["mi325x"].peak_tflops == 1307.4
    assert (gpus["mi300x"].memory_gib, gpus["mi325x"].memory_gib) == (192, 256)
    assert load_hardware("gb200").name == "gb200-nvl72"


def test_plan_hardware_lists_the_new_gpus_with_sources():
    result = CliRunner().invoke(app, ["hardware"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in NEW:
        assert name in result.output
    assert "GB200 NVL72 specifications" in result.output and "NVLink domain" in result.output
    js = CliRunner().invoke(app, ["hardware", "--json"])
    data = json.loads(js.output)
    assert data["h800"]["values"]["intra_node_gbps"] == 200
    assert "400GB/s" in data["h800"]["sources"]["intra_node_gbps"]
