"""What loading found about a payload, kept for loading the same payload again.

Before ExecuTorch's backend gets a payload, :mod:`.backend` checks it against the program
(:func:`.schema.validate_payload`, the externals, the output shapes, the serialized dims)
and checks its quantization parameters (:func:`.backend.quantization_problem`). Those
checks read only:

- the graph, its constant buffers included, but for its nodes' debug handles and its named
  keys (the digest of its form, :mod:`.forms`, else its flatbuffer's SHA-256, which
  :func:`.schema.decode_payload` records when it is small enough to hash);
- the size of the payload's constant region, and the size of each named data entry the
  graph refers to (or that it is missing), not its name;
- of the call's argument tensors, each one's dtype, sizes, dim order and dynamism;
- for the quantization, the bytes of every scale buffer (kept only where they are few:
  :func:`scales_key`).

:func:`structure_key` and :func:`scales_key` make keys of exactly those; what they
found is kept under them in bounded in-process caches: that every structural check passed,
and what XNNPACK would refuse of the quantization (or nothing). A check that failed is never
kept: a defective payload is checked, and refused, every time. A payload too large to hash has no key and is checked every time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence

from ...format import program as p
from ...format.lru import Key, Lru
from . import schema as s

__all__ = ["clear_checked", "scales", "scales_key", "structure_key", "structures"]

ENTRIES = 4096
structures: Lru[bool] = Lru(ENTRIES, 0)  # True: every structural check passed
scales: Lru[tuple[str | None]] = Lru(ENTRIES, 0)  # (what XNNPACK would refuse,)


def clear_checked() -> None:
    """Forget every kept verdict."""
    structures.clear()
    scales.clear()


def _named_sizes(
    payload: s.XnnPayload, named_data: Mapping[str, memoryview]
) -> tuple[int | None, ...]:
    """Per constant entry with a named key, the size of its named data (None: missing)."""
    out = []
    for e in payload.graph.constant_data:
        if e.named_key is not None:
            got = named_data.get(e.named_key)
            out.append(None if got is None else len(got))
    return tuple(out)


def structure_key(
    payload: s.XnnPayload,
    named_data: Mapping[str, memoryview],
    tensors: Sequence[p.Tensor | None],
) -> Hashable | None:
    """The key of the structural checks of ``payload`` for a call on ``tensors`` (None:
    the graph was not hashed). The graph is named by its form where it has one (the
    checks read no debug handle, and of a named key only whether the program has it and
    its size), else by its flatbuffer."""
    if payload.digest is None:
        return None
    region = payload.header.constant_data_size if payload.header is not None else 0
    graph = ("form", payload.form) if payload.form is not None else ("graph", payload.digest)
    return Key(graph, region, _named_sizes(payload, named_data), _as_checked(tensors))


def _as_checked(tensors: Sequence[p.Tensor | None]) -> tuple[object, ...]:
    """What the checks read of the call's tensors: each one's dtype, sizes, dim order and
    dynamism (not where it is planned: a layer's call is checked as the layer before)."""
    return tuple(
        None if t is None else (t.scalar_type, t.sizes, t.dim_order, t.shape_dynamism)
        for t in tensors
    )


def scales_key(
    structure: Hashable, payload: s.XnnPayload, named_data: Mapping[str, memoryview]
) -> Hashable | None:
    """The key of the quantization check: the structure's key and the SHA-256 of every
    scale buffer's bytes. Only for a payload that passed the structural checks (its
    constant indices and sizes are valid). None when the scale buffers hold more than
    :data:`SCALE_BYTES_HASHED` bytes together: hashing them would cost what checking them
    does (an LLM's per-group scales), so such a payload is checked every time."""
    raws = [
        payload.constant_bytes(q.scale_buffer_idx, named_data)
        for v in payload.graph.values
        if (q := v.quant) is not None and isinstance(q, _PER_CHANNEL) and q.scale_buffer_idx
    ]
    if sum(len(raw) for raw in raws) > SCALE_BYTES_HASHED:
        return None
    h = hashlib.sha256()
    for raw in raws:
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return Key(structure, h.digest())


SCALE_BYTES_HASHED = 16 << 10
_PER_CHANNEL = (s.PerChannelQuant, s.PerChannelGroupQuant)
