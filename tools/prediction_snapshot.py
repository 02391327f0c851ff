"""The predictions of every bundled validation case, stored so that a refactor can prove it moved
no number (issue #28: "every number the tool printed before is unchanged").

    python tools/prediction_snapshot.py           # exit 1 and list the cases that moved
    python tools/prediction_snapshot.py --write   # store today's predictions

tests/test_predictions_unchanged.py runs the check. A change that is meant to move a prediction
rewrites the file in the same commit and says which cases moved and why. The README's solve
outputs are covered apart, by tools/readme_blocks.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "validation_predictions.json"
FIELDS = ("configuration", "predicted_step_s", "predicted_tflops", "predicted_memory_gib",
          "predicted_oom", "stack", "hardware")


def predictions() -> dict[str, dict]:
    from planner.fidelity.published import validate_file
    rows, _ = validate_file()
    return {f"{r.dataset}/{r.case}": {f: getattr(r, f) for f in FIELDS} for r in rows}


def moved(stored: dict, now: dict, rel: float = 1e-9) -> list[str]:
    """The cases whose predictions differ (floats beyond ``rel``), or that appeared or went."""
    out = sorted(set(stored) ^ set(now))
    for case in sorted(set(stored) & set(now)):
        for field in FIELDS:
            a, b = stored[case].get(field), now[case].get(field)
            if isinstance(a, float) and isinstance(b, float):
                if abs(a - b) > rel * max(abs(a), abs(b)):
                    out.append(f"{case}: {field} {a!r} -> {b!r}")
            elif a != b:
                out.append(f"{case}: {field} {a!r} -> {b!r}")
    return out


def main(argv: list[str]) -> int:
    now = predictions()
    if "--write" in argv:
        SNAPSHOT.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(now)} cases to {SNAPSHOT}")
        return 0
    changes = moved(json.loads(SNAPSHOT.read_text()), now)
    print("\n".join(changes) or f"all {len(now)} cases unchanged")
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
