"""Graphs alike but for their debug handles and named keys. Imports no torch.

An exported LLM has one XNNPACK payload per linear (or attention block) per layer, and a
layer's payload is the layer before it byte for byte except in two kinds of field: each
node's ``debug_handle`` (a number the exporter counts up) and each constant's
``named_key`` (the name of its weights in the program's named data, a digest of them), a
string of the same length in every layer. Decoding every such payload is most of what
loading its graphs costs.

A *form* is what a decoded graph's flatbuffer is with those fields' bytes zeroed, and the
SHA-256 of that is the form's digest. Where another flatbuffer of the same size has the
same digest once its bytes at the same places are zeroed, it is the same graph with its own
handles and keys: :mod:`.schema` reads them from it and puts them into the graph it
decoded already, and everything checked about the graph's structure holds for both.

That holds only if nothing else in the flatbuffer is read from those bytes (a handle that
is also part of an offset, say). So a form is used only after a flatbuffer of it, with
every one of those bytes changed to a value drawn at random, decodes to the graph with
exactly those changed handles and keys: a byte any other field read would have changed
that field. The values are drawn from the operating system's random source, so a file
cannot be written to pass the test and then read differently. The test is made when a
second flatbuffer has the form, in place of decoding that one: a payload like no other
costs only finding its fields. This module finds and changes the bytes; :mod:`.schema`
decodes and compares.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import threading
from dataclasses import dataclass
from typing import Generic, TypeVar

from ...format.flatbuf import Buffer

__all__ = ["Form", "Forms", "Spans", "Variables", "altered", "find_spans", "masked_digest", "read"]

T = TypeVar("T")

_U32 = struct.Struct("<I")
_NODES_SLOT = 1  # XNNGraph.xnodes
_HANDLE_SLOT = 2  # XNode.debug_handle
_CONSTANTS_SLOT = 8  # XNNGraph.constant_data
_KEY_SLOT = 2  # ConstantDataOffset.named_key
_LETTERS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@dataclass(frozen=True, slots=True)
class Spans:
    """Where the variable fields of a flatbuffer are: per ``xnodes`` item, the position of
    its debug handle (a little-endian u32; -1: absent), and per ``constant_data`` item,
    the (start, length) of its named key's characters ((-1, 0): absent)."""

    handles: tuple[int, ...]
    keys: tuple[tuple[int, int], ...]


# (per xnodes item: its handle, None where absent; per constant entry: its key, None where
# absent or empty, as the decoder reads an empty key)
Variables = tuple[tuple[int | None, ...], tuple[str | None, ...]]


def _items(buf: Buffer, table: int, slot: int) -> list[int] | None:
    """Positions of the tables of vector field ``slot`` of table ``table``; None where the
    buffer does not hold them as expected ([] where the field is absent)."""
    offsets = buf.field_offsets(table)
    if offsets is None:
        return None
    at = buf.table_at(table, offsets, slot)
    if at == 0:
        return []
    if at < 0 or at + 4 > buf.size:
        return None
    n = _U32.unpack_from(buf.data, at)[0]
    start = at + 4
    if start + 4 * n > buf.size:
        return None
    out = []
    for i, rel in enumerate(struct.unpack_from(f"<{n}I", buf.data, start)):
        if rel == 0:
            return None
        out.append(start + 4 * i + rel)
    return out


def find_spans(fb: bytes | bytearray | memoryview) -> Spans | None:
    """The variable fields of a flatbuffer that decoded without error; None when they
    cannot all be found, or when two of them share some bytes without being the same
    field (a form is then not worth the doubt)."""
    buf = Buffer(fb)
    if buf.size < 8:
        return None
    root = _U32.unpack_from(buf.data, 0)[0]
    nodes = _items(buf, root, _NODES_SLOT)
    constants = _items(buf, root, _CONSTANTS_SLOT)
    if nodes is None or constants is None:
        return None
    handles: list[int] = []
    for at in nodes:
        offsets = buf.field_offsets(at)
        if offsets is None:
            return None
        off = offsets[_HANDLE_SLOT] if len(offsets) > _HANDLE_SLOT else 0
        if off and at + off + 4 > buf.size:
            return None
        handles.append(at + off if off else -1)
    keys: list[tuple[int, int]] = []
    for at in constants:
        offsets = buf.field_offsets(at)
        if offsets is None:
            return None
        s = buf.table_at(at, offsets, _KEY_SLOT)
        if s == 0:
            keys.append((-1, 0))
            continue
        if s < 0 or s + 4 > buf.size:
            return None
        n = _U32.unpack_from(buf.data, s)[0]
        if s + 4 + n > buf.size:
            return None
        keys.append((s + 4, n) if n else (-1, 0))
    ranges = sorted({(h, h + 4) for h in handles if h >= 0} | {(s, s + n) for s, n in keys if n})
    for (_, end), (start, _) in itertools.pairwise(ranges):
        if start < end:
            return None
    return Spans(tuple(handles), tuple(keys))


def masked_digest(fb: bytes | bytearray | memoryview, spans: Spans) -> bytes:
    """SHA-256 of ``fb`` with the bytes of ``spans`` zeroed."""
    masked = bytearray(fb)
    for h in spans.handles:
        if h >= 0:
            masked[h : h + 4] = b"\0\0\0\0"
    for s, n in spans.keys:
        if n:
            masked[s : s + n] = bytes(n)
    return hashlib.sha256(masked).digest()


def altered(fb: bytes | bytearray | memoryview, spans: Spans) -> bytearray:
    """A copy of ``fb`` whose every byte in ``spans`` is changed at random: a handle's
    bytes each XORed with a nonzero random byte, a key's characters each replaced by a
    random ASCII letter or digit other than itself (the key stays UTF-8)."""
    out = bytearray(fb)
    for h in spans.handles:
        if h >= 0:
            noise = os.urandom(4)
            for k in range(4):
                out[h + k] ^= noise[k] or 0xA5
    for s, n in spans.keys:
        noise = os.urandom(n)
        for k in range(n):
            c = _LETTERS[noise[k] % len(_LETTERS)]
            if c == out[s + k]:
                c = _LETTERS[(noise[k] + 1) % len(_LETTERS)]
            out[s + k] = c
    return out


def read(fb: bytes | bytearray | memoryview, spans: Spans) -> Variables | None:
    """The handles and keys of ``fb`` at ``spans``; None when a key is not UTF-8 (the
    decoder then reads the flatbuffer, and raises)."""
    data = fb
    handles = tuple(_U32.unpack_from(data, h)[0] if h >= 0 else None for h in spans.handles)
    keys: list[str | None] = []
    for s, n in spans.keys:
        if not n:
            keys.append(None)
            continue
        try:
            keys.append(bytes(data[s : s + n]).decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return handles, tuple(keys)


@dataclass(slots=True)
class Form(Generic[T]):
    """A kept form: its digest, where its variable fields are, what it stands for (the
    graph of the flatbuffer it was found in), and whether it passed the test with random
    bytes (a form is tested when a second flatbuffer has it: one alone never needs it)."""

    digest: bytes
    spans: Spans
    value: T
    verified: bool = False


class Forms(Generic[T]):
    """Kept forms by flatbuffer size: at most ``per_size`` forms of one size (the most
    recently found first), of at most ``sizes`` sizes (the least recently used size goes
    first)."""

    def __init__(self, sizes: int = 256, per_size: int = 4) -> None:
        self.sizes = sizes
        self.per_size = per_size
        self._by_size: dict[int, list[Form[T]]] = {}
        self._lock = threading.Lock()

    def match(self, fb: bytes | bytearray | memoryview) -> tuple[Form[T], Variables] | None:
        """The kept form ``fb`` has, with ``fb``'s own handles and keys; None when none
        is kept, or a key is not UTF-8."""
        kept = self._by_size.get(len(fb))
        if not kept:
            return None
        for form in tuple(kept):
            if masked_digest(fb, form.spans) == form.digest:
                found = read(fb, form.spans)
                return None if found is None else (form, found)
        return None

    def keep(self, size: int, form: Form[T]) -> None:
        """Keep ``form`` of flatbuffers of ``size`` bytes (an earlier one of its digest
        goes)."""
        with self._lock:
            kept = self._by_size.pop(size, [])
            kept = [k for k in kept if k.digest != form.digest][: self.per_size - 1]
            kept.insert(0, form)
            self._by_size[size] = kept  # (now the most recently used size)
            while len(self._by_size) > self.sizes:
                del self._by_size[next(iter(self._by_size))]

    def drop(self, size: int, form: Form[T]) -> None:
        """Forget ``form`` (it failed its test)."""
        with self._lock:
            kept = self._by_size.get(size)
            if kept is not None and form in kept:
                kept.remove(form)

    def clear(self) -> None:
        with self._lock:
            self._by_size.clear()
