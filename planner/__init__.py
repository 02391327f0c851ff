"""plan3d: plan tensor x pipeline x data parallel training of large models."""

from planner.core.version import __version__

__all__ = ["__version__"]
