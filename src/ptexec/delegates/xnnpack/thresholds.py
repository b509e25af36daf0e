"""Sizes at which the generated code picks one torch kernel over another (measured with
``benchmarks/xnnpack_kernels.py``)."""

from __future__ import annotations

__all__ = ["CL_POOL_ELEMENTS", "INT_MM_WEIGHTS", "TINY_CONV_FLOPS"]

# Below this many flops (per call, at the serialized shape) a CPU convolution runs with
# torch's direct kernel instead of oneDNN's, whose fixed cost per call is larger.
TINY_CONV_FLOPS = 1_000_000
# From this many input elements a pool on NCHW memory copies its input to channels-last
# memory first: copy and pool take 1.5-9x less than the pool on NCHW memory from 16x48x48
# on; up to a few thousand elements the copy costs as much as it saves, or more
# (benchmarks/xnnpack_kernels.py --only pool)
CL_POOL_ELEMENTS = 8192
# From this many weights a dynamically quantized linear on the CPU multiplies in int8
# (torch._int_mm, VNNI) rather than in float32: about as fast for one 128x384 row, twice
# as fast for 64 rows of 256x768 (benchmarks/xnnpack_kernels.py --only linear).
INT_MM_WEIGHTS = 65536
