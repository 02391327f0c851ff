"""plan3d: plan tensor x pipeline x data parallel training of large models."""

__version__ = "0.1.0"
