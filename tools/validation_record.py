"""Write the validation record `plan solve` prints (planner/fidelity/record.py) from the current
model, or check that the stored one is current.

    python tools/validation_record.py            # check (exit 1 if stale)
    python tools/validation_record.py --write    # rewrite profiles/validation/record.json
"""

from __future__ import annotations

import argparse
import sys

from planner.core.files import write_text
from planner.fidelity.holdout import held_out_file
from planner.fidelity.published import validate_file
from planner.fidelity.record import RECORD_FILE, families, record_text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the stored record")
    args = parser.parse_args()
    rows = validate_file()[0]
    text = record_text(families(rows, held_out_file(rows)))
    if args.write:
        write_text(RECORD_FILE, text, force=True)
        print(f"wrote {RECORD_FILE}")
        return 0
    current = RECORD_FILE.exists() and RECORD_FILE.read_text() == text
    print(f"{RECORD_FILE}: {'current' if current else 'stale: run with --write'}")
    return 0 if current else 1


if __name__ == "__main__":
    sys.exit(main())
