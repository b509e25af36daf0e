"""The one exception hierarchy of ptexec.

Every error ptexec raises on purpose is a :class:`PtexecError`. Each subclass also derives
from the builtin exception a Python user would expect (``ValueError`` for bad data,
``RuntimeError`` for failures while running, ``KeyError`` for unknown names,
``FileNotFoundError`` for a missing file), and every one of them is also a
``RuntimeError``, the one type ExecuTorch's bindings raise, so code written against
ExecuTorch keeps catching what it caught before (``except RuntimeError``) and code written
for Python's conventions catches what it expects (``except ValueError``, ``KeyError``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CALL_REFUSALS",
    "AudioFormatError",
    "BackendUnavailableError",
    "CacheEntryError",
    "ColumnError",
    "ConfigError",
    "ConfigTypeError",
    "ConfigValueError",
    "DeviceUnavailableError",
    "ExecutionError",
    "ExportError",
    "FileMissingError",
    "FileUnreadableError",
    "GenerationError",
    "InputError",
    "InstructionLimitError",
    "LimitExceededError",
    "MethodNotFoundError",
    "NotFoundError",
    "OperatorMissingError",
    "OutputMismatchError",
    "ProgramChangedError",
    "PteFormatError",
    "PtexecError",
    "RowError",
    "StateError",
    "StatefulMethodError",
    "TokenizerError",
    "UnsupportedDeviceError",
]


class PtexecError(RuntimeError):
    """Base class of every error ptexec raises on purpose (a ``RuntimeError``, as every
    error of ExecuTorch's bindings is)."""


class PteFormatError(PtexecError, ValueError, RuntimeError):
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


class CacheEntryError(PtexecError, ValueError, RuntimeError):
    """A compile-cache entry that is damaged, not confined to its directory, or not
    trusted (what, and where). Loading never raises it: such an entry is a miss."""


class ProgramChangedError(PtexecError, RuntimeError):
    """A program's file changed on disk under a program loaded with ``mmap=True``."""


class NotFoundError(PtexecError, KeyError, RuntimeError):
    """A name or index that is not there (a method's attribute, a bundled test case)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MethodNotFoundError(NotFoundError):
    """A method name (or index) that the program does not have."""


class FileMissingError(PtexecError, FileNotFoundError, RuntimeError):
    """A program or data file that does not exist (``errno``, ``filename`` as the OS said)."""


class FileUnreadableError(PtexecError, OSError, RuntimeError):
    """A program or data file that is there but cannot be read: a directory, no
    permission, an I/O error (``errno``, ``strerror``, ``filename`` as the OS said)."""


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


class InputError(PtexecError, ValueError, RuntimeError):
    """An input (or a caller-given output) that does not fit the method; nothing was written."""


class UnsupportedDeviceError(PtexecError, ValueError, RuntimeError):
    """Memory on a device ptexec does not model (only cpu and cuda are)."""


class DeviceUnavailableError(PtexecError, RuntimeError):
    """The program needs a device this machine does not have (e.g. CUDA without a GPU).

    The message is ``reason`` and then ``hint``, advice for a Python caller (a
    ``device_map``); ``device`` is the device asked for and ``cuda_devices`` how many CUDA
    devices torch sees, when known, so that another front end can give its own advice.
    """

    def __init__(
        self, reason: str, hint: str = "", device: str = "", cuda_devices: int = 0
    ) -> None:
        self.reason = reason
        self.hint = hint
        self.device = device
        self.cuda_devices = cuda_devices
        super().__init__(f"{reason}; {hint}" if hint else reason)

    def __reduce__(self) -> tuple[type, tuple[str, str, str, int]]:
        return (type(self), (self.reason, self.hint, self.device, self.cuda_devices))


CALL_REFUSALS: tuple[type[PtexecError], ...] = (
    InputError,
    UnsupportedDeviceError,
    DeviceUnavailableError,
)
"""What a method's call raises when it refused its arguments before writing anything: an
input or ``out=`` tensor that does not fit, memory on a device ptexec does not model, CUDA
memory on a machine without CUDA."""


class LimitExceededError(PtexecError, RuntimeError):
    """A configured limit was reached (planned bytes, instruction count, ETDump debug buffer)."""


class StateError(PtexecError, RuntimeError):
    """Something asked of an object that its state does not have: the ETDump of a program
    loaded without ``enable_etdump=True``, a method's outputs before it ran."""


class OutputMismatchError(PtexecError, RuntimeError):
    """Outputs that differ from the expected ones (a bundled program's test case)."""


class ExportError(PtexecError, RuntimeError):
    """ExecuTorch's exporter gave a program that breaks what an export recipe promises
    (:func:`ptexec.export.to_pte`: every activation on the device, inputs and outputs the
    caller's, no copies between devices)."""


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


class AudioFormatError(PtexecError, ValueError, RuntimeError):
    """Audio that cannot be read or used: a malformed or unsupported file, samples of the
    wrong shape, more samples than a preprocessor program takes."""


class GenerationError(PtexecError, RuntimeError):
    """A text-generation request that the program cannot serve: not a generation program,
    a prompt past its context, or a step asked of the runner out of order."""


class ConfigError(PtexecError, RuntimeError):
    """A setting (a field of a configuration, an option of a call) that cannot be used;
    ``field`` names it. Raised as :class:`ConfigTypeError` or :class:`ConfigValueError`."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.field, str(self)))


class ConfigTypeError(ConfigError, TypeError):
    """A setting of the wrong type (a string for a number, a bool for a count)."""


class ConfigValueError(ConfigError, ValueError):
    """A setting of the right type outside its range (a NaN temperature, a count of 0)."""


class ColumnError(InputError):
    """A dataset's columns do not fit a method's inputs or outputs (a missing column, rows
    of a shape or dtype the input cannot take, an output without the rows along dim 0);
    ``column`` names the column ("" when the problem is the mapping as a whole)."""

    def __init__(self, column: str, message: str) -> None:
        self.column = column
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.column, str(self)))


class RowError(InputError):
    """A row of a batch that the method refused or failed on; ``row`` is its position in
    the batch, ``row_id`` its value in the id column (None without one), ``rows`` how many
    rows from ``row`` on shared the failed call (1 once the row was tried alone). The
    method's own error is ``__cause__``; ``detail`` is its text."""

    def __init__(self, row: int, row_id: object, detail: str, rows: int = 1) -> None:
        self.row = row
        self.row_id = row_id
        self.detail = detail
        self.rows = rows
        where = f"row {row}" if rows == 1 else f"rows {row}..{row + rows - 1} (one call)"
        if row_id is not None:
            where += f" (id {row_id!r})"
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> tuple[type, tuple[int, object, str, int]]:
        return (type(self), (self.row, self.row_id, self.detail, self.rows))


class StatefulMethodError(PtexecError, ValueError, RuntimeError):
    """A method keeps state from call to call (mutable buffers), so its calls on different
    rows are not independent; batch inference refuses it unless told how to treat it."""
