"""The ``.pte`` / ``.ptd`` file format: bytes -> validated, frozen descriptions (no torch)."""

from .program import Program
from .pte import PteFile, read_pte
from .ptd import PtdFile, read_ptd

__all__ = ["Program", "PtdFile", "PteFile", "read_ptd", "read_pte"]
