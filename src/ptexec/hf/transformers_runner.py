"""ptexec as the runner of transformers' ExecuTorch exports (``transformers.exporters``,
transformers >= 5.23).

transformers runs an export through a runner registered for its format
(``transformers.exporters.auto.register_backend(exporter, runner)``). :func:`register`
registers, for ``export_format="executorch"``:

- :class:`PtexecModelRunner`, the ``ModelRunner``: ``from_program(program, metadata,
  device)`` loads the program's ``forward`` with ptexec, placed on ``device``
  (``ExportedModel.to("cuda")``; None leaves it where the program says, the CPU for
  XNNPACK and portable exports); ``__call__(share_inputs, share_outputs, **kwargs)``
  flattens the kwargs as ``torch.export`` traced them (the metadata's ``in_spec`` and
  scalar constants), runs, and rebuilds the model's outputs (``out_spec``,
  ``out_constants``). ``share_outputs=True`` returns views of the method's memory, valid
  until its next call; ``share_inputs=False`` hands the program copies, so one that writes
  its inputs in place (``alloc_graph_input=False`` exports) leaves the caller's tensors
  alone.
- the exporter, ExecuTorch's own with one change: a saved ``.pte`` is read back
  (``ExportedModel.from_pretrained``) by ptexec, not by ExecuTorch's runtime.

Nothing changes for a process that does not call :func:`register`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.fx._pytree as fx_pytree
from transformers.exporters.auto import register_backend
from transformers.exporters.exporter_executorch import ExecutorchExporter
from transformers.exporters.metadata import load_treespec
from transformers.exporters.runners.base import ModelRunner

from .. import program as _program
from .. import runtime as _runtime

__all__ = ["PtexecExecutorchExporter", "PtexecModelRunner", "SavedProgram", "register"]


class SavedProgram(_runtime.Program):
    """A ``.pte`` that ``ExportedModel.from_pretrained`` read, with ptexec: an
    ``executorch.runtime``-style program that remembers its file (``path``), which
    transformers copies when the model is saved again."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(_runtime.load_source(Path(path)))
        self.path = str(path)


def as_program(program: Any) -> _program.Program:
    """The ptexec program behind whatever transformers hands a runner: the exporter's
    ``ExecutorchProgramManager`` (its ``buffer``), a program read back from disk (ours, or
    ExecuTorch's with its ``path``), or a ptexec program."""
    if isinstance(program, _program.Program):
        return program
    if isinstance(program, _runtime.Program):
        return program.program
    path = getattr(program, "path", None)
    if isinstance(path, str | Path):
        return _runtime.load_source(Path(path))
    buffer = getattr(program, "buffer", None)
    if isinstance(buffer, bytes | bytearray):
        return _runtime.load_source(buffer)
    raise TypeError(
        "expected an ExecuTorch program (ExecutorchProgramManager, a program read from a .pte "
        f"or a ptexec program), got {type(program).__name__}"
    )


def _device(device: Any) -> torch.device | None:
    if device is None:
        return None
    return device if isinstance(device, torch.device) else torch.device(device)


class PtexecModelRunner(ModelRunner):  # type: ignore[misc]
    """Runs an ExecuTorch program's ``forward`` on ptexec, its inputs flattened as
    ``torch.export`` traced them (see the module docstring)."""

    def __init__(
        self,
        program: _program.Program,
        metadata: Any,
        device: Any = None,
        *,
        compile: bool = False,
        cuda_graph: bool = False,
    ) -> None:
        super().__init__(metadata)
        target = _device(device)
        # inputs come from tokenizers and processors on the host: a method on a GPU takes
        # them across (counted in method.last_call) rather than refusing them
        self.method = program.load_method(
            "forward",
            device_map=None if target is None else str(target),
            transfers="allow",
            compile=compile,
            cuda_graph=cuda_graph,
        )
        self.in_spec = load_treespec(metadata.in_spec)
        self._device_ = target or _first_device(self.method)

    @property
    def device(self) -> torch.device:
        """Where the program's tensors live (its first input's device, or the one given)."""
        return self._device_

    @classmethod
    def from_program(
        cls,
        program: Any,
        metadata: Any,
        device: Any = None,
        compile: bool = False,
        cuda_graph: bool = False,
    ) -> PtexecModelRunner:
        """A runner for ``program`` on ``device`` (None: the devices the program names).
        ``compile``: run its straight-line regions AOTInductor-compiled (see
        :mod:`ptexec.compile`); ``cuda_graph``: replay a static CUDA method as one graph."""
        return cls(as_program(program), metadata, device, compile=compile, cuda_graph=cuda_graph)

    def __call__(
        self, share_inputs: bool = True, share_outputs: bool = False, **kwargs: Any
    ) -> Any:
        """Run the program on the traced forward's kwargs and return what the model
        returns; ``share_outputs``: views valid until the next call, not copies."""
        leaves = fx_pytree.tree_flatten_spec(
            ((), {**self.metadata.in_constants, **kwargs}), self.in_spec
        )
        # a string is a constant the program baked in: its slot takes None
        feed = [
            None
            if isinstance(leaf, str)
            else leaf.clone()
            if isinstance(leaf, torch.Tensor) and not share_inputs
            else leaf
            for leaf in leaves
        ]
        # a tensor that is not dense (expanded, sliced, transposed) is laid out as the
        # program takes it, as transformers' own runner makes its inputs contiguous
        dense = all(not isinstance(x, torch.Tensor) or x.is_contiguous() for x in feed)
        outputs = self.method.execute(
            feed, outputs="view" if share_outputs else "copy", layout=None if dense else "convert"
        )
        return self.unflatten(outputs)


def _first_device(method: Any) -> torch.device:
    for info in (*method.meta.inputs, *method.meta.outputs):
        device = getattr(info, "device", None)
        if device is not None:
            return torch.device(str(device))
    return torch.device("cpu")


class PtexecExecutorchExporter(ExecutorchExporter):  # type: ignore[misc]
    """ExecuTorch's exporter, whose saved programs are read back by ptexec."""

    @classmethod
    def load_program(cls, path: str | Path) -> SavedProgram:
        return SavedProgram(path)


def register() -> None:
    """Run transformers' ``export_format="executorch"`` models on ptexec in this process:
    ``ExportedModel.from_pretrained(dir)`` reads with ptexec and ``.to(device)`` runs there.

    Replacing ExecuTorch's registration is the point, so transformers' "already registered
    and will be overwritten" warning is left out for this call (and only that message)."""
    logger = logging.getLogger(register_backend.__module__)
    replacing = _DropOverwriteWarning()
    logger.addFilter(replacing)
    try:
        register_backend(PtexecExecutorchExporter, PtexecModelRunner)
    finally:
        logger.removeFilter(replacing)


class _DropOverwriteWarning(logging.Filter):
    """Drops transformers' note that a registered export format is being replaced."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "will be overwritten" not in record.getMessage()
