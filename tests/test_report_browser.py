"""`plan report` in a real browser (#33 item 4): headless Chromium (Debian's package) opens the
page from a real search, logs no console message (the page runs no script, so any message is a
fault: an error, a blocked fetch, a CSP complaint), its DOM holds every section and chart, and the
screenshot is kept as an artifact of the test run ($PLAN3D_ARTIFACTS, else tests/artifacts/).

Skipped where no Chromium is installed, but a failure where .ci/run installed it
(PLAN3D_REQUIRE_ENGINE=1), so CI never passes by skipping. The first test shows the console
check itself catches a page that does raise, so a quiet report is evidence, not luck.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from planner import api
from planner.report.html_report import SECTIONS

pytestmark = pytest.mark.slow

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH, HEIGHT = 1100, 2600  # px; the screenshot the README shows
ARTIFACTS = Path(os.environ.get("PLAN3D_ARTIFACTS") or Path(__file__).parent / "artifacts")


def _browser() -> str:
    found = next((p for p in map(shutil.which, BROWSERS) if p), None)
    if found:
        return found
    if os.environ.get("PLAN3D_REQUIRE_ENGINE") == "1":
        pytest.fail("no chromium on PATH, but PLAN3D_REQUIRE_ENGINE=1 (.ci/run installs it)")
    pytest.skip("no chromium on PATH (apt-get install chromium)")


def _run(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on ``page`` with its console logged to stderr; its own profile directory
    (parallel runs must not share one), no sandbox (CI runs as root in a container)."""
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           "--enable-logging=stderr", "--v=0", f"--window-size={WIDTH},{HEIGHT}", *args,
           page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console_lines(stderr: str) -> list[str]:
    """The page's console messages as Chromium logs them ("INFO:CONSOLE(12)] ..." or
    "INFO:CONSOLE:12] ..."), uncaught exceptions included."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR: width, height


def test_the_console_check_catches_a_page_that_raises(tmp_path):
    page = tmp_path / "raises.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('seen');"
                    "no_such_function();</script></body></html>")
    done = _run(page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = console_lines(done.stderr)
    assert any("seen" in line for line in lines), done.stderr[-2000:]
    assert any("no_such_function" in line for line in lines), done.stderr[-2000:]


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> Path:
    """The report of a real search, as `plan solve --report` writes it."""
    page = tmp_path_factory.mktemp("report") / "report.html"
    api.report(api.solve(gpus=16, nodes=2), out=page)
    return page


def test_the_report_renders_in_chromium_without_console_messages(report_page, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    done = _run(report_page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not console_lines(done.stderr), "\n".join(console_lines(done.stderr))
    assert _png_size(shot) == (WIDTH, HEIGHT)
    assert shot.stat().st_size > 50_000  # a blank page is a few kB; the report draws charts
    print(f"screenshot: {shot}")


def test_the_browser_builds_every_section_and_chart(report_page, tmp_path):
    """The DOM after parsing (not the file's text): every section, and each of the four charts
    an <svg> with its shapes, so no markup error swallowed a chart."""
    done = _run(report_page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    for key in SECTIONS:
        assert f'<section id="{key}">' in dom, key
    assert dom.count("<svg") == 4  # memory bars, Gantt, rank grid, scatter
    source = report_page.read_text()
    for shape in ('class="part"', 'class="op"', 'class="gpu"', 'class="plan"',
                  'class="candidate"'):
        assert dom.count(shape) == source.count(shape) > 0, shape
    assert not console_lines(done.stderr), "\n".join(console_lines(done.stderr))
