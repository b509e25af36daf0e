"""ptexec: a device-aware Python runtime for ExecuTorch programs (.pte)."""

__version__ = "0.1.0"
