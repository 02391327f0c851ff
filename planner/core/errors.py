"""Errors the CLI turns into one line and an exit code, never a traceback."""


class PlanInputError(ValueError):
    """Bad input from the user (file, flag, pin): exit code 2, message says what to change."""


class NoFeasiblePlan(RuntimeError):
    """The search found nothing that fits: exit code 1, with the rejection reasons counted."""

    def __init__(self, message: str, rejected: dict[str, int] | None = None):
        super().__init__(message)
        self.rejected = dict(rejected or {})
