"""Write docs/report.png, the README's picture of `plan report`: the report of the README's
export example (Llama-3-70B on 64 H100s in 8 nodes) shot by headless Chromium, as the browser
test shoots it, then reduced to a 256-colour palette (Pillow, from the plot extra) so the committed
file stays small.

    python tools/report_screenshot.py            # rewrite docs/report.png
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from planner import api

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "report.png"
WIDTH, HEIGHT = 1000, 2700  # px: the whole page at a width a README column shows


def main() -> int:
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
    if browser is None:
        print("no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 1
    from PIL import Image  # the plot extra's (matplotlib's) dependency

    with tempfile.TemporaryDirectory() as tmp:
        page, shot = Path(tmp) / "report.html", Path(tmp) / "report.png"
        api.report(api.solve(gpus=64, nodes=8, model="llama3-70b", gpu="h100"), out=page)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={tmp}/profile",
                        f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}",
                        page.as_uri()], check=True, capture_output=True, timeout=120)
        image = Image.open(shot).convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)
        image.save(OUT, optimize=True)
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
