"""ptexec's version (also ``ptexec.__version__``), importable from any layer."""

__version__ = "0.1.0"
