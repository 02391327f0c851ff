"""plan: the plan3d command line. Its code is the planner.cli package; this file keeps
`python cli.py ...` and `from cli import app` working from a checkout."""

import sys

from planner.cli import app, main  # noqa: F401

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
