"""XNNPACK payloads written directly with ExecuTorch's own serializer (``XNNGraph``
dataclasses + ``serialize_xnnpack_binary``), for node types and layouts the 1.5.1
partitioner does not emit from a PyTorch module (ELU, ArgMaxPooling2d, asymmetric
paddings, constants inside the payload, int8 tensors at the delegate boundary), and for
malformed payloads. The runner is built and called directly, without a ``.pte``; the
references are plain PyTorch or explicit loops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ptexec.delegates.xnnpack.runtime import ArgInfo, build_runner
from ptexec.delegates.xnnpack.schema import decode_payload, describe_payload
from ptexec.errors import BackendUnavailableError, PteFormatError

sch = pytest.importorskip("executorch.backends.xnnpack.serialization.xnnpack_graph_schema")
ser = pytest.importorskip("executorch.backends.xnnpack.serialization.xnnpack_graph_serialize")

INVALID = 0xFFFFFFFF
FP32 = sch.XNNDatatype.xnn_datatype_fp32
FP16 = sch.XNNDatatype.xnn_datatype_fp16
QINT8 = sch.XNNDatatype.xnn_datatype_qint8


class G:
    """A small graph under construction: values, nodes and constant data."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.nodes: list[Any] = []
        self.blob = bytearray()
        self.consts: list[Any] = [sch.ConstantDataOffset(offset=0, size=0)]
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.ext = 0

    def _tensor(self, dims: Sequence[int], dtype: int, flags: int, ext: int, buf: int) -> Any:
        return sch.XNNTensorValue(
            datatype=dtype,
            num_dims=len(dims),
            dims=list(dims),
            constant_buffer_idx=buf,
            external_id=ext,
            flags=flags,
            id_out=len(self.values),
        )

    def value(
        self,
        dims: Sequence[int],
        dtype: int = FP32,
        io: str = "",
        data: torch.Tensor | None = None,
        qparams: Any = None,
    ) -> int:
        flags, ext = 0, INVALID
        if io:
            flags = 1 if io == "in" else 2
            ext = self.ext
            self.ext += 1
        buf = 0
        if data is not None:
            raw = data.contiguous().view(torch.uint8).numpy().tobytes()
            while len(self.blob) % 16:
                self.blob.append(0)
            self.consts.append(sch.ConstantDataOffset(offset=len(self.blob), size=len(raw)))
            self.blob += raw
            buf = len(self.consts) - 1
        tv = self._tensor(dims, dtype, flags, ext, buf)
        if qparams is not None:
            xv = sch.XValue(
                xvalue_union=sch.XNNQuantizedTensorValue(tensor_value=tv, quant_params=qparams)
            )
        else:
            xv = sch.XValue(xvalue_union=tv)
        self.values.append(xv)
        vid = len(self.values) - 1
        if io == "in":
            self.inputs.append(vid)
        elif io == "out":
            self.outputs.append(vid)
        return vid

    def node(self, union: Any, out_min: float | None = None, out_max: float | None = None) -> None:
        mm = None
        if out_min is not None or out_max is not None:
            mm = sch.OutputMinMax(
                output_min="-inf" if out_min is None else out_min,
                output_max="inf" if out_max is None else out_max,
            )
        self.nodes.append(
            sch.XNode(xnode_union=union, debug_handle=len(self.nodes), output_min_max=mm)
        )

    def payload(self) -> bytes:
        graph = sch.XNNGraph(
            version="0",
            xnodes=self.nodes,
            xvalues=self.values,
            num_externs=self.ext,
            input_ids=self.inputs,
            output_ids=self.outputs,
            constant_data=self.consts,
        )
        return bytes(ser.serialize_xnnpack_binary(graph, self.blob))


def run(
    g: G, args: Sequence[torch.Tensor], orders: Sequence[tuple[int, ...]] | None = None
) -> None:
    payload = decode_payload(g.payload(), "test")
    infos = [
        ArgInfo(a.dtype, orders[i] if orders else tuple(range(a.dim()))) for i, a in enumerate(args)
    ]
    runner = build_runner(payload, {}, infos, "cpu")
    runner(*args)


def test_elu_from_a_written_payload() -> None:
    g = G()
    x = g.value([2, 3, 4], io="in")
    y = g.value([2, 3, 4], io="out")
    g.node(sch.XNNELU(alpha=0.7, input_id=x, output_id=y, flags=0))
    xt = torch.randn(2, 3, 4) * 2
    out = torch.empty(2, 3, 4)
    run(g, [xt, out])
    torch.testing.assert_close(out, F.elu(xt, 0.7))
    assert describe_payload(g.payload()) == {"ELU": 1}


def test_argmax_pooling_values_and_window_indices() -> None:
    g = G()
    x = g.value([1, 4, 6, 3], io="in")
    vals = g.value([1, 2, 2, 3], io="out")
    idx = g.value([1, 2, 2, 3], io="out")
    g.node(
        sch.XNNArgMaxPooling2d(
            padding_top=0,
            padding_right=0,
            padding_bottom=0,
            padding_left=0,
            pooling_height=2,
            pooling_width=3,
            input_id=x,
            output_value_id=vals,
            output_index_id=idx,
            flags=0,
        )
    )
    xt = torch.randn(1, 4, 6, 3)
    ov = torch.empty(1, 2, 2, 3)
    oi = torch.empty(1, 2, 2, 3, dtype=torch.int64)  # ExecuTorch's index tensors are int64
    run(g, [xt, ov, oi])
    for i in range(2):
        for j in range(2):
            for c in range(3):
                win = xt[0, 2 * i : 2 * i + 2, 3 * j : 3 * j + 3, c].reshape(-1)
                assert ov[0, i, j, c] == win.max()
                assert oi[0, i, j, c] == int(torch.argmax(win))


def test_fully_connected_with_constants_inside_the_payload() -> None:
    g = G()
    w = torch.randn(5, 7)
    b = torch.randn(5)
    x = g.value([3, 7], io="in")
    wv = g.value([5, 7], data=w)
    bv = g.value([5], data=b)
    y = g.value([3, 5], io="out")
    g.node(
        sch.XNNFullyConnected(input1_id=x, filter_id=wv, bias_id=bv, output_id=y, flags=0),
        out_min=-0.5,
        out_max=0.5,
    )
    xt = torch.randn(3, 7)
    out = torch.empty(3, 5)
    run(g, [xt, out])
    torch.testing.assert_close(out, (xt @ w.T + b).clamp(-0.5, 0.5))


def _pool(
    cls: Any,
    x: int,
    y: int,
    k: tuple[int, int],
    s: tuple[int, int],
    pads: tuple[int, int, int, int],
) -> Any:
    return cls(
        padding_top=pads[0],
        padding_right=pads[1],
        padding_bottom=pads[2],
        padding_left=pads[3],
        pooling_height=k[0],
        pooling_width=k[1],
        stride_height=s[0],
        stride_width=s[1],
        dilation_height=1,
        dilation_width=1,
        input_id=x,
        output_id=y,
        flags=0x40,
    )


def test_pooling_with_asymmetric_padding() -> None:
    # top 1, right 2, bottom 0, left 0: NHWC [1, 5, 5, 2] -> [1, 2, 3, 2] with a 2x2 window, stride 2
    pads = (1, 2, 0, 0)
    g = G()
    x = g.value([1, 5, 5, 2], io="in")
    ym = g.value([1, 3, 3, 2], io="out")
    ya = g.value([1, 3, 3, 2], io="out")
    g.node(_pool(sch.XNNMaxPooling2d, x, ym, (2, 2), (2, 2), pads))
    g.node(_pool(sch.XNNAvgPooling2d, x, ya, (2, 2), (2, 2), pads))
    xt = torch.randn(1, 5, 5, 2)
    om, oa = torch.empty(1, 3, 3, 2), torch.empty(1, 3, 3, 2)
    run(g, [xt, om, oa])
    padded = torch.full((1, 6, 7, 2), math.nan)
    padded[:, 1:6, 0:5] = xt
    for i in range(3):
        for j in range(3):
            win = padded[0, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].reshape(-1, 2)
            valid = win[~torch.isnan(win[:, 0])]
            torch.testing.assert_close(om[0, i, j], valid.max(0).values)
            torch.testing.assert_close(oa[0, i, j], valid.mean(0))


def test_transposed_convolution_with_asymmetric_padding() -> None:
    w = torch.randn(3, 4, 3, 3)  # torch layout [in, out, kh, kw]
    b = torch.randn(4)
    g = G()
    x = g.value([1, 4, 5, 3], io="in")
    wv = g.value([4, 3, 3, 3], data=w.permute(1, 2, 3, 0).contiguous())  # [out, kh, kw, in]
    bv = g.value([4], data=b)
    y = g.value([1, 8, 11, 4], io="out")
    g.node(
        sch.XNNConvTranspose2d(
            padding_top=1,
            padding_right=0,
            padding_bottom=0,
            padding_left=1,
            kernel_height=3,
            kernel_width=3,
            subsampling_height=2,
            subsampling_width=2,
            dilation_height=1,
            dilation_width=1,
            group_input_channels=3,
            group_output_channels=4,
            groups=1,
            adjustment_height=0,
            adjustment_width=1,
            input1_id=x,
            filter_id=wv,
            bias_id=bv,
            output_id=y,
            flags=0,
        )
    )
    xt = torch.randn(1, 4, 5, 3)
    out = torch.empty(1, 8, 11, 4)
    run(g, [xt, out])
    full = F.conv_transpose2d(xt.permute(0, 3, 1, 2), w, b, 2, 0, (0, 1))
    ref = full[:, :, 1:, 1:].permute(0, 2, 3, 1)
    torch.testing.assert_close(out, ref)


def test_reshape_infers_a_zero_and_slice_to_the_end() -> None:
    g = G()
    x = g.value([2, 3, 4], io="in")
    r = g.value([6, 4])
    y = g.value([6, 3], io="out")
    g.node(sch.XNNStaticReshape(num_dims=2, new_shape=[0, 4], input_id=x, output_id=r, flags=0))
    # XNNPACK's slice ends at offset + size; an end of 0 means "to the end of the dim"
    g.node(
        sch.XNNStaticSlice(
            num_dims=2, offsets=[0, 1], sizes=[0, 3], input_id=r, output_id=y, flags=0
        )
    )
    xt = torch.randn(2, 3, 4)
    out = torch.empty(6, 3)
    run(g, [xt, out])
    torch.testing.assert_close(out, xt.reshape(6, 4)[:, 1:4])


def test_convert_between_float_types() -> None:
    g = G()
    x = g.value([4, 5], io="in")
    h = g.value([4, 5], dtype=FP16)
    y = g.value([4, 5], dtype=FP16, io="out")
    g.node(sch.XNNConvert(input_id=x, output_id=h, flags=0))
    g.node(sch.XNNAdd(input1_id=h, input2_id=h, output_id=y, flags=0))
    xt = torch.randn(4, 5)
    out = torch.empty(4, 5, dtype=torch.float16)
    run(g, [xt, out])
    assert torch.equal(out, xt.half() + xt.half())


def test_int8_tensors_at_the_boundary() -> None:
    """A quantized add whose inputs and output are int8 tensors of the method, computed
    as XNNPACK's int8 add kernel does (20-bit fixed-point multipliers, a rounding shift),
    with the relu's bound quantized to the output's zero point."""
    import numpy as np

    qa, qb, qy = (
        sch.PerTensorQuant(scale=s, zero_point=z) for s, z in ((0.05, 3), (0.1, -7), (0.08, 10))
    )
    g = G()
    a = g.value([3, 4], dtype=QINT8, io="in", qparams=qa)
    b = g.value([3, 4], dtype=QINT8, io="in", qparams=qb)
    y = g.value([3, 4], dtype=QINT8, io="out", qparams=qy)
    g.node(sch.XNNAdd(input1_id=a, input2_id=b, output_id=y, flags=0), out_min=0.0, out_max=None)
    gen = torch.Generator().manual_seed(3)
    at = torch.randint(-128, 128, (3, 4), dtype=torch.int8, generator=gen)
    bt = torch.randint(-128, 128, (3, 4), dtype=torch.int8, generator=gen)
    out = torch.empty(3, 4, dtype=torch.int8)
    run(g, [at, bt, out])
    # xnn_init_qs8_add_minmax_scalar_params, xnn_qs8_vadd_minmax_ukernel__scalar_u1
    f32 = np.float32
    a_os, b_os = f32(f32(0.05) / f32(0.08)), f32(f32(0.1) / f32(0.08))
    shift = 20 - (int(np.frombuffer(max(a_os, b_os).tobytes(), np.uint32)[0] >> 23) - 127)
    am, bm = (int(np.rint(f32(v * f32(2.0**shift)))) for v in (a_os, b_os))
    bias = (1 << (shift - 1)) - am * 3 - bm * (-7)
    ref = [
        min(max(((bias + x * am + z * bm) >> shift) + 10, 10), 127)  # relu: q >= zero point
        for x, z in zip(at.reshape(-1).tolist(), bt.reshape(-1).tolist(), strict=True)
    ]
    assert out.reshape(-1).tolist() == ref


def test_channels_last_argument_is_read_in_its_dim_order() -> None:
    """A 4-d argument with dim order (0, 2, 3, 1) is NHWC to XNNPACK."""
    g = G()
    x = g.value([2, 3, 4, 5], io="in")  # XNNPACK dims = NHWC sizes of an NCHW tensor [2, 5, 3, 4]
    y = g.value([2, 3, 4, 5], io="out")
    g.node(sch.XNNSoftmax(input_id=x, output_id=y, flags=0))
    xt = torch.randn(2, 5, 3, 4).to(memory_format=torch.channels_last)
    out = torch.empty(2, 5, 3, 4).to(memory_format=torch.channels_last)
    run(g, [xt, out], orders=[(0, 2, 3, 1), (0, 2, 3, 1)])
    torch.testing.assert_close(out, torch.softmax(xt, dim=1))  # channels are XNNPACK's last dim


def test_outputs_are_resized_to_the_computed_shape() -> None:
    g = G()
    x = g.value([4, 6], io="in")
    y = g.value([4, 6], io="out")
    g.node(sch.XNNTanh(input_id=x, output_id=y, flags=0))
    xt = torch.randn(2, 6)  # fewer rows than the serialized example
    out = torch.empty(4, 6)
    run(g, [xt, out])
    assert out.shape == (2, 6)
    torch.testing.assert_close(out, torch.tanh(xt))


# -- what ptexec refuses ------------------------------------------------------------------


def test_sdpa_node_is_refused_by_name() -> None:
    g = G()
    q = g.value([1, 2, 4, 8], io="in")
    k = g.value([1, 2, 4, 8], io="in")
    v = g.value([1, 2, 4, 8], io="in")
    sc = g.value([8], data=torch.full((8,), 0.35))
    mask = g.value([4, 4], data=torch.zeros(4, 4))
    y = g.value([1, 2, 4, 8], io="out")
    g.node(
        sch.XNNScaledDotProductAttention(
            query_id=q, key_id=k, value_id=v, scale_id=sc, mask_id=mask, output_id=y, flags=0
        )
    )
    args = [torch.randn(1, 2, 4, 8) for _ in range(4)]
    with pytest.raises(BackendUnavailableError, match="ScaledDotProductAttention"):
        run(g, args)


def _node_type_offset(data: bytes, node: int) -> int:
    """Byte offset (in the payload) of node ``node``'s union type field."""
    p = decode_payload(data)
    from ptexec.format.flatbuf import Buffer

    fb = Buffer(
        memoryview(data)[p.flatbuffer_offset : p.flatbuffer_offset + p.header.flatbuffer_size]
    )  # type: ignore[union-attr]
    nodes = fb.root().tables(1, "xnodes", lambda t: t)
    assert nodes is not None
    return p.flatbuffer_offset + nodes[node]._field(0)


def test_unknown_node_type_is_refused_by_code() -> None:
    g = G()
    x = g.value([3], io="in")
    y = g.value([3], io="out")
    g.node(sch.XNNAbs(input_id=x, output_id=y, flags=0))
    data = bytearray(g.payload())
    data[_node_type_offset(bytes(data), 0)] = 99
    payload = decode_payload(bytes(data), "p")
    assert describe_payload(bytes(data)) == {"unknown(99)": 1}
    with pytest.raises(BackendUnavailableError, match="unknown node type 99"):
        build_runner(payload, {}, [ArgInfo(torch.float32, (0,))] * 2)


def _abs_graph() -> G:
    g = G()
    x = g.value([3], io="in")
    y = g.value([3], io="out")
    g.node(sch.XNNAbs(input_id=x, output_id=y, flags=0))
    return g


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda b: b[:20], "header"),  # truncated header
        (lambda b: b[:10] + (9999).to_bytes(4, "little") + b[14:], "header"),  # flatbuffer offset
        (
            lambda b: b[:22] + (1 << 40).to_bytes(8, "little") + b[30:],
            "header",
        ),  # constant data size
        (lambda b: b[:36] + b"XN99" + b[40:], "identifier"),
    ],
)
def test_malformed_headers(mutate: Any, where: str) -> None:
    data = mutate(_abs_graph().payload())
    with pytest.raises(PteFormatError) as info:
        decode_payload(data, "p")
    assert info.value.path.startswith(f"p.{where}")


def test_reference_to_a_missing_value() -> None:
    g = G()
    x = g.value([3], io="in")
    y = g.value([3], io="out")
    g.node(sch.XNNAdd(input1_id=x, input2_id=7, output_id=y, flags=0))
    with pytest.raises(PteFormatError) as info:
        run(g, [torch.randn(3), torch.empty(3)])
    assert info.value.path == "test.xnodes[0].Add.input2_id"


def test_constant_past_the_constant_data() -> None:
    g = G()
    x = g.value([3], io="in")
    c = g.value([3], data=torch.ones(3))
    y = g.value([3], io="out")
    g.node(sch.XNNAdd(input1_id=x, input2_id=c, output_id=y, flags=0))
    g.consts[1] = sch.ConstantDataOffset(
        offset=8, size=12
    )  # 12 bytes from 8: past the 12-byte region
    with pytest.raises(PteFormatError) as info:
        run(g, [torch.randn(3), torch.empty(3)])
    assert info.value.path == "test.constant_data[1]"


def test_constant_smaller_than_its_value() -> None:
    g = G()
    x = g.value([3], io="in")
    c = g.value([4], data=torch.ones(3))
    y = g.value([3], io="out")
    g.node(sch.XNNAdd(input1_id=x, input2_id=c, output_id=y, flags=0))
    with pytest.raises(PteFormatError, match="needs 16") as info:
        run(g, [torch.randn(3), torch.empty(3)])
    assert info.value.path == "test.xvalues[1].constant_buffer_idx"


def test_external_id_beyond_the_call_arguments() -> None:
    g = _abs_graph()
    payload = decode_payload(g.payload(), "test")
    with pytest.raises(PteFormatError, match="not a tensor argument") as info:
        build_runner(payload, {}, [ArgInfo(torch.float32, (0,))])
    assert info.value.path == "test.xvalues[1].external_id"


def test_argument_dtype_must_match_the_value() -> None:
    payload = decode_payload(_abs_graph().payload(), "test")
    with pytest.raises(PteFormatError, match="fp32 value bound to a int32 tensor"):
        build_runner(payload, {}, [ArgInfo(torch.int32, (0,)), ArgInfo(torch.float32, (0,))])


def test_value_read_before_it_is_written() -> None:
    g = G()
    x = g.value([3], io="in")
    t = g.value([3])
    y = g.value([3], io="out")
    g.node(sch.XNNAdd(input1_id=x, input2_id=t, output_id=y, flags=0))
    g.node(sch.XNNAbs(input_id=x, output_id=t, flags=0))
    with pytest.raises(PteFormatError, match="before any node writes it"):
        run(g, [torch.randn(3), torch.empty(3)])


def _qd8_literal(row: Any) -> tuple[Any, float, float]:
    """XNNPACK's per-row dynamic quantization, transcribed step by step in float32."""
    import numpy as np

    f = np.float32
    r = row.numpy().astype(np.float32)
    rmin, rmax = f(min(0.0, r.min())), f(max(0.0, r.max()))
    mult = f(1.0) if rmin == rmax else f(255.0) / f(rmax - rmin)
    dmin, dmax = f(rmin * mult), f(rmax * mult)
    zp = f(-128 - dmin) if f(f(-128 + dmin) + f(127 + dmax)) > 0 else f(127 - dmax)
    zp = np.rint(min(max(zp, f(-128)), f(127)))
    q = np.clip(np.rint(r * mult) + zp, -128, 127)
    return q, float(zp), float(f(1) / mult)


@pytest.mark.parametrize(
    "x",
    [torch.randn(7, 33) * 3, torch.rand(4, 16) + 1, -torch.rand(4, 16), torch.randn(3, 2, 8)],
    ids=["mixed", "positive", "negative", "3d"],
)
def test_per_token_quantization_follows_xnnpack(x: torch.Tensor) -> None:
    from ptexec.delegates.xnnpack.quant import quantize_rows

    r = quantize_rows(x, 1)
    q, zp, scale = r.centered + r.zp, r.zp, r.scale
    for i, row in enumerate(x.reshape(-1, x.shape[-1])):
        rq, rz, rs = _qd8_literal(row)
        assert q[i].tolist() == rq.tolist()
        assert zp[i].item() == rz
        assert scale[i].item() == pytest.approx(rs, rel=1e-6)


def test_int8_convolution_accumulates_exactly_past_float32() -> None:
    """A static int8 convolution whose partial sums pass 2**24, where a float32
    accumulation rounds (checked below): each output equals XNNPACK's exact int32
    accumulation, computed here with Python integers."""
    QC8, QC32 = sch.XNNDatatype.xnn_datatype_qcint8, sch.XNNDatatype.xnn_datatype_qcint32
    cin, cout, zx, zy = 256, 3, -128, 5
    gen = torch.Generator().manual_seed(7)
    w = torch.randint(100, 128, (cout, 3, 3, cin), generator=gen, dtype=torch.int8)  # OHWI
    xt = torch.randint(100, 128, (1, 3, 3, cin), generator=gen, dtype=torch.int8)  # NHWC
    sums = [
        sum(a * b for a, b in zip((xt.long() - zx).reshape(-1).tolist(), w[c].reshape(-1).tolist(), strict=True))
        for c in range(cout)
    ]  # fmt: skip
    targets = [-7, 40, 101]
    bias = torch.tensor([t - s for t, s in zip(targets, sums, strict=True)], dtype=torch.int32)
    # scales whose requantization scale is exactly 1: the output is the accumulator
    sx, ws, sy = 0.5, 0.25, 0.125
    wq = sch.PerChannelQuant(scale=[ws] * cout, channel_dim=0, scale_buffer_idx=0, num_scales=cout)
    bq = sch.PerChannelQuant(
        scale=[sx * ws] * cout, channel_dim=0, scale_buffer_idx=0, num_scales=cout
    )
    g = G()
    x = g.value([1, 3, 3, cin], dtype=QINT8, io="in", qparams=sch.PerTensorQuant(sx, zx))
    fw = g.value([cout, 3, 3, cin], dtype=QC8, data=w, qparams=wq)
    fb = g.value([cout], dtype=QC32, data=bias, qparams=bq)
    y = g.value([1, 1, 1, cout], dtype=QINT8, io="out", qparams=sch.PerTensorQuant(sy, zy))
    g.node(
        sch.XNNConv2d(
            padding_top=0, padding_right=0, padding_bottom=0, padding_left=0, kernel_height=3,
            kernel_width=3, subsampling_height=1, subsampling_width=1, dilation_height=1,
            dilation_width=1, group_input_channels=cin, group_output_channels=cout, groups=1,
            adjustment_height=0, adjustment_width=0, input1_id=x, filter_id=fw, bias_id=fb,
            output_id=y, flags=0,
        )
    )  # fmt: skip
    out = torch.empty(1, 1, 1, cout, dtype=torch.int8)
    run(g, [xt, out])
    assert out.reshape(-1).tolist() == [t + zy for t in targets]
    # float32 arithmetic would not have given that
    f32 = F.conv2d(
        (xt.float() - zx).permute(0, 3, 1, 2), w.float().permute(0, 3, 1, 2), bias.float()
    ).reshape(-1)
    assert f32.tolist() != [float(t) for t in targets]
