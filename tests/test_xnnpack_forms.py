"""Payloads alike but for debug handles and named keys are decoded once.

A layer's XNNPACK payload is the layer before it but for its nodes' debug handles and its
constants' named keys (ptexec.delegates.xnnpack.forms). Here: every graph decoded through
a kept form equals the graph decoded from nothing; a payload alone has no tested form; a
payload with other handles and keys has the form of the first (tested then) and its own
handles and keys; a payload changed anywhere else is decoded afresh; a key that is not
UTF-8 is refused as before; a form whose bytes something else reads is never used; the
structural checks' key names the form, and still tells a missing named key.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from ptexec.delegates.xnnpack import checked, forms, schema
from ptexec.errors import PteFormatError
from ptexec.format import pte
from ptexec.format.flatbuf import Buffer

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "fixtures" / "xnnpack"
MANIFEST: dict[str, Any] = json.loads((DIR / "manifest.json").read_text())


def _payloads(name: str) -> list[bytes]:
    desc = pte.read_pte((DIR / MANIFEST[name]["pte"]).read_bytes())
    return [
        bytes(desc.delegate_data(d.processed))
        for plan in desc.program.execution_plan
        for d in plan.delegates
    ]


def _fresh(data: bytes | bytearray) -> schema.XnnPayload:
    """``data`` decoded with nothing kept."""
    schema.clear_decoded_graphs()
    return schema.decode_payload(data)


def _flatbuffer(data: bytes) -> tuple[int, int]:
    p = _fresh(data)
    assert p.header is not None
    return p.flatbuffer_offset, p.header.flatbuffer_size


def _with_keys() -> bytes:
    """A payload whose graph has named keys and debug handles."""
    for data in _payloads("transformer_int4_group"):
        g = _fresh(data).graph
        if any(e.named_key for e in g.constant_data) and g.nodes:
            return data
    raise AssertionError("no payload with named keys")


def _layer(data: bytes, k: int) -> bytearray:
    """``data`` as another layer's payload: its handles moved by ``1000 * k``, each of
    its keys made of one letter (the ``k``-th from its own)."""
    start, size = _flatbuffer(data)
    spans = forms.find_spans(memoryview(data)[start : start + size])
    assert spans is not None
    out = bytearray(data)
    for h in spans.handles:
        if h >= 0:
            at = start + h
            struct.pack_into("<I", out, at, struct.unpack_from("<I", out, at)[0] + 1000 * k)
    for i, (s, n) in enumerate(spans.keys):
        if n:
            out[start + s : start + s + n] = bytes([ord("a") + (i + k) % 26]) * n
    return out


@pytest.mark.parametrize(
    "name", ["deit_tiny_int8_static_pc", "transformer_int4_group", "transformer_fp16"]
)
def test_every_graph_equals_its_own_decoding(name: str) -> None:
    payloads: list[bytes | bytearray] = list(_payloads(name))
    payloads += [_layer(bytes(data), k) for k in (1, 2) for data in _payloads(name)]
    schema.clear_decoded_graphs()
    through_forms = [schema.decode_payload(data) for data in payloads]
    for data, p in zip(payloads, through_forms, strict=True):
        alone = _fresh(data)
        assert p.graph == alone.graph
        assert [n.debug_handle for n in p.graph.nodes] == [
            n.debug_handle for n in alone.graph.nodes
        ]
        assert [e.named_key for e in p.graph.constant_data] == [
            e.named_key for e in alone.graph.constant_data
        ]
        assert alone.form is None  # (a payload alone: its form untested, not named)
    # the layers made alike share their originals' forms (the first of each untested)
    n = len(payloads) // 3
    assert all(p.form is not None for p in through_forms[n:])
    assert [p.form for p in through_forms[n : 2 * n]] == [p.form for p in through_forms[2 * n :]]


def test_a_payload_with_other_handles_and_keys_has_the_first_ones_form() -> None:
    data = _with_keys()
    other = _layer(data, 1)
    first = _fresh(data)
    assert first.form is None  # one payload of its form: not tested, not named
    alike = schema.decode_payload(other)  # the first's form, tested now
    again = schema.decode_payload(_layer(data, 2))
    assert alike.form is not None and again.form == alike.form
    assert alike.digest != first.digest
    assert [n.debug_handle for n in alike.graph.nodes] == [
        n.debug_handle + 1000 for n in first.graph.nodes
    ]
    keys = [e.named_key for e in alike.graph.constant_data]
    assert any(keys) and keys != [e.named_key for e in first.graph.constant_data]
    assert all(k is None or len(set(k)) == 1 for k in keys)
    assert alike.graph == _fresh(other).graph


def _node_field_at(data: bytes) -> int:
    """Where in ``data`` the first field the first node's table holds is (an id or a
    parameter of the node: a scalar outside every handle and key)."""
    start, size = _flatbuffer(data)
    buf = Buffer(memoryview(data)[start : start + size])
    root = struct.unpack_from("<I", buf.data, 0)[0]
    nodes = buf.table_at(root, buf.field_offsets(root) or (), 1)
    first = nodes + 4 + struct.unpack_from("<I", buf.data, nodes + 4)[0]
    body = buf.table_at(first, buf.field_offsets(first) or (), 1)
    offsets = [o for o in buf.field_offsets(body) or () if o]
    assert body > 0 and offsets
    return start + body + offsets[0]


def test_a_payload_changed_elsewhere_is_decoded_afresh() -> None:
    data = _with_keys()
    at = _node_field_at(data)
    changed = bytearray(data)
    changed[at] ^= 0x01
    want = _fresh(changed).graph
    first = _fresh(data)
    got = schema.decode_payload(changed)  # the first's form kept; this one is not it
    assert got.form is None
    assert got.graph == want and got.graph != first.graph


def test_a_key_that_is_not_utf8_is_refused() -> None:
    data = _with_keys()
    start, size = _flatbuffer(data)
    spans = forms.find_spans(memoryview(data)[start : start + size])
    assert spans is not None
    s, n = next((s, n) for s, n in spans.keys if n)
    bad = bytearray(data)
    bad[start + s : start + s + n] = b"\xff" * n
    schema.clear_decoded_graphs()
    schema.decode_payload(data)  # its form kept
    with pytest.raises(PteFormatError, match="not UTF-8"):
        schema.decode_payload(bad)


def test_a_form_whose_bytes_something_else_reads_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spans that take in bytes another field reads (as a file could make a handle share
    its bytes with a node's id) fail the test with random bytes that a second payload of
    the form meets: that one is decoded afresh, as one differing there is, and the form
    is dropped."""
    data = _with_keys()
    start, _ = _flatbuffer(data)
    at = _node_field_at(data) - start
    find = forms.find_spans

    def claiming(fb: Any) -> forms.Spans | None:
        spans = find(fb)
        return None if spans is None else forms.Spans((*spans.handles, at), spans.keys)

    monkeypatch.setattr(forms, "find_spans", claiming)
    changed = bytearray(data)
    changed[start + at] ^= 0x01
    schema.clear_decoded_graphs()
    schema.decode_payload(data)  # its form noted, with the claimed bytes
    got = schema.decode_payload(changed)  # of that form, as the claim has it: tested
    assert got.form is None
    again = schema.decode_payload(_layer(data, 1))  # the form was dropped
    monkeypatch.undo()
    assert got.graph == _fresh(changed).graph
    assert again.form is None


def test_the_checks_key_names_the_form_and_tells_a_missing_key() -> None:
    data = _with_keys()
    _fresh(data)
    a = schema.decode_payload(_layer(data, 1))
    b = schema.decode_payload(_layer(data, 2))

    def named(p: schema.XnnPayload) -> dict[str, memoryview]:
        return {
            e.named_key: memoryview(bytes(e.size))
            for e in p.graph.constant_data
            if e.named_key is not None
        }

    key_a = checked.structure_key(a, named(a), [])
    assert key_a is not None and key_a == checked.structure_key(b, named(b), [])
    missing = dict(named(b))
    missing.popitem()
    assert checked.structure_key(b, missing, []) != key_a
