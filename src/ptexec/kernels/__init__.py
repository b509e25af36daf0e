"""Kernels: the registry and the operator families ptexec provides.

Importing this package registers every built-in kernel: any ATen operator through
``torch.ops`` (:mod:`.aten`), ExecuTorch's prim and symbolic ops (:mod:`.prim`),
``dim_order_ops`` (:mod:`.dim_order`), device copies (:mod:`.device_copy`), and the
quantized and LLM custom ops (:mod:`.quantized`, :mod:`.llm`).
"""

from . import aten, device_copy, dim_order, llm, prim, quantized  # noqa: F401  (registration)
from .registry import KernelContext, Statement, UnsupportedKernel, find_kernel, register

__all__ = ["KernelContext", "Statement", "UnsupportedKernel", "find_kernel", "register"]
