"""ptexec under Hugging Face's stacks: optimum-executorch and transformers' exporters.

- :func:`ptexec.use_as_executorch` (:mod:`ptexec.hf.switch`): ExecuTorch's runtime module
  names resolve to ptexec's, so optimum-executorch's ``ExecuTorchModelFor*`` classes (and
  any other code written for ExecuTorch's Python runtime) run on ptexec unchanged.
- :func:`register` (:mod:`ptexec.hf.transformers_runner`): transformers' ExecuTorch
  exports (``transformers.exporters``, transformers >= 5.23) run on ptexec, on the device
  ``ExportedModel.to(device)`` names.

Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from .switch import is_active, use_as_executorch

__all__ = ["is_active", "register", "use_as_executorch"]


def register() -> None:
    """Register ptexec as the runner of transformers' ``export_format="executorch"`` models
    in this process (see :func:`ptexec.hf.transformers_runner.register`)."""
    from .transformers_runner import register as _register

    _register()
