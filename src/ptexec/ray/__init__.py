"""Batch inference over Ray Data datasets (``pip install '.[ray]'`` in ptexec's source tree).

    import ray, ptexec.ray
    ds = ray.data.read_parquet("s3://bucket/features/")
    scored = ptexec.ray.map_program(ds, "model.pte", inputs=["x"], outputs=["logits"],
                                    concurrency=4, batch_size=512)

or, with Ray's own API, :class:`PteMapper` as the callable class of ``map_batches``::

    ds.map_batches(ptexec.ray.PteMapper,
                   fn_constructor_kwargs={"path": "model.pte", "inputs": ["x"],
                                          "outputs": ["logits"], "device": "auto"},
                   compute=ray.data.ActorPoolStrategy(size=4), batch_size=512, num_gpus=1)

Each actor loads the program once and maps batch columns to method inputs, and outputs
back to columns (rules in :mod:`ptexec.ray.batching`):

- rows reach the method batched along dim 0 (a static batch dim is filled by splitting
  and padding, a bounded one used up to its bound) or one call per row, decided by the
  columns' shapes; columns of variable-shaped rows are grouped by shape;
- column dtypes are converted to the input's when ``cast`` allows (``"same_kind"``, the
  default: float64 to float32 yes, float to int no, and only when every value survives
  the conversion; ``"no"``; ``"unsafe"``);
- a row the method refuses or fails on raises :class:`~ptexec.errors.RowError`
  (``on_error="raise"``), or with ``on_error="record"`` gets its message in
  ``error_column`` (None for good rows; it may not name an input, output, id or kept
  column) and fill values in the outputs; a missing row (None, or a block of null rows,
  which Ray hands over as NaN, or a null in an integer column) is such a row;
  ``id_column`` names a column whose value identifies the row in the error;
- the batch's columns are kept (``keep_columns=True``; False keeps none, a list those).

Importing this module does not import Ray; :func:`map_program` does.
"""

from __future__ import annotations

from .batching import Batcher, BatchStats
from .dataset import default_batch_size, map_program
from .mapper import PteMapper, State, assigned_device, choose_device_map, state_tensors

__all__ = [
    "BatchStats",
    "Batcher",
    "PteMapper",
    "State",
    "assigned_device",
    "choose_device_map",
    "default_batch_size",
    "map_program",
    "state_tensors",
]
