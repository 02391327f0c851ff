"""The package version, in one place (exports and profiles stamp it into what they write)."""

__version__ = "0.1.0"
