"""The ``.pte`` / ``.ptd`` file format: bytes -> validated, frozen descriptions (no torch)."""

from .program import Program
from .ptd import PtdFile, read_ptd
from .pte import PteFile, read_pte

__all__ = ["Program", "PtdFile", "PteFile", "read_ptd", "read_pte"]
