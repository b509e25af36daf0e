"""The one exception hierarchy of ptexec.

Every error ptexec raises on purpose is a :class:`PtexecError`. Each subclass also derives
from the builtin exception a Python user would expect (``ValueError`` for bad data,
``RuntimeError`` for failures while running, ``KeyError`` for unknown names), so code
written against ExecuTorch's bindings keeps catching what it caught before.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BackendUnavailableError",
    "DeviceUnavailableError",
    "ExecutionError",
    "GenerationError",
    "InputError",
    "InstructionLimitError",
    "LimitExceededError",
    "MethodNotFoundError",
    "OperatorMissingError",
    "ProgramChangedError",
    "PteFormatError",
    "PtexecError",
    "TokenizerError",
    "UnsupportedDeviceError",
]


class PtexecError(Exception):
    """Base class of every error ptexec raises on purpose."""


class PteFormatError(PtexecError, ValueError):
    """A ``.pte`` or ``.ptd`` file is malformed; ``path`` says where in the file.

    The message reads ``<path>: <what is wrong>``, for example
    ``execution_plan[0].values[17].tensor.allocation_info: bytes 4096..4608 exceed buffer 1
    (4000 bytes)``.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}" if path else message)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.path, self.detail))


class ProgramChangedError(PtexecError, RuntimeError):
    """A program's file changed on disk under a program loaded with ``mmap=True``."""


class MethodNotFoundError(PtexecError, KeyError):
    """A method name that the program does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class OperatorMissingError(PtexecError, RuntimeError):
    """Operators a method needs that no kernel provides; all of them, reported at load."""

    def __init__(self, method: str, operators: Sequence[str]) -> None:
        self.method = method
        self.operators = tuple(operators)
        listed = ", ".join(self.operators)
        super().__init__(
            f"method '{method}' needs {len(self.operators)} operator(s) ptexec has no kernel "
            f"for: {listed}"
        )

    def __reduce__(self) -> tuple[type, tuple[str, tuple[str, ...]]]:
        return (type(self), (self.method, self.operators))


class BackendUnavailableError(PtexecError, RuntimeError):
    """A delegate backend (or a part of its payload) that ptexec cannot run."""


class InputError(PtexecError, ValueError):
    """An input (or a caller-given output) that does not fit the method; nothing was written."""


class UnsupportedDeviceError(PtexecError, ValueError):
    """Memory on a device ptexec does not model (only cpu and cuda are)."""


class DeviceUnavailableError(PtexecError, RuntimeError):
    """The program needs a device this machine does not have (e.g. CUDA without a GPU)."""


class LimitExceededError(PtexecError, RuntimeError):
    """A configured limit was reached (planned bytes, instruction count)."""


class ExecutionError(PtexecError, RuntimeError):
    """A failure while executing an instruction.

    ``instruction`` is the index in the method's chain, ``operator`` the kernel or delegate
    name (or the instruction kind), ``frame`` the source location when the program carries
    stack traces; the original exception is ``__cause__``.
    """

    def __init__(
        self,
        method: str,
        instruction: int,
        operator: str,
        message: str,
        frame: str | None = None,
    ) -> None:
        self.method = method
        self.instruction = instruction
        self.operator = operator
        self.frame = frame
        self.detail = message
        where = f"'{method}' instruction {instruction} ({operator})"
        text = f"{where}: {message}"
        if frame:
            text += "\n  exported from:\n    " + frame.replace("\n", "\n    ")
        super().__init__(text)

    def __reduce__(self) -> tuple[type, tuple[str, int, str, str, str | None]]:
        return (
            type(self),
            (self.method, self.instruction, self.operator, self.detail, self.frame),
        )


class InstructionLimitError(LimitExceededError, ExecutionError):
    """An execution stopped at ``max_instructions`` (a malformed jump may loop forever).

    Both a :class:`LimitExceededError` (a configured limit) and an :class:`ExecutionError`
    (it happens while executing; ``instruction`` is where it stopped).
    """


class TokenizerError(PtexecError, RuntimeError):
    """A tokenizer file that no supported format reads, or text or ids it cannot convert."""


class GenerationError(PtexecError, RuntimeError):
    """A text-generation request that the program cannot serve: not a generation program,
    a prompt past its context, or a step asked of the runner out of order."""
