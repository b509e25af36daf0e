"""XNNPACK-delegated programs (made by scripts/make_xnnpack_fixtures.py) run by ptexec.

Every fixture is compared, call by call, with what ExecuTorch's runtime (with its XNNPACK
backend) returned for the same file when the fixture was made, with eager PyTorch, and,
where the XNNPACK backend is installed, with ExecuTorch's runtime live.
"""

from __future__ import annotations

import json
import random
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import compare_outputs
from ptexec.delegates.xnnpack import describe_payload
from ptexec.errors import BackendUnavailableError, PteFormatError, PtexecError
from ptexec.format.flatbuf import Buffer
from ptexec.format.pte import read_pte

DIR = Path(__file__).resolve().parent / "fixtures" / "xnnpack"
MANIFEST: dict[str, Any] = json.loads((DIR / "manifest.json").read_text())
NAMES = sorted(MANIFEST)
DOC = Path(__file__).resolve().parent.parent / "docs" / "xnnpack_coverage.md"


@cache
def _calls(name: str) -> list[dict[str, Any]]:
    return torch.load(DIR / f"{name}.io.pt", weights_only=True)["calls"]  # type: ignore[no-any-return]


def _replay(name: str, **options: Any) -> list[list[Any]]:
    method = ptexec.load(DIR / MANIFEST[name]["pte"]).load_method("forward", **options)
    return [method.execute([_to(x, options) for x in c["inputs"]]) for c in _calls(name)]


def _to(x: Any, options: dict[str, Any]) -> Any:
    dev = options.get("device_map")
    return x.to(dev) if dev and isinstance(x, torch.Tensor) else x


def _et_runtime() -> Any:
    rt = pytest.importorskip("executorch.runtime").Runtime.get()
    if "XnnpackBackend" not in rt.backend_registry.registered_backend_names:
        pytest.skip("ExecuTorch's runtime here has no XnnpackBackend")
    return rt


def test_fixtures_cover_every_recipe() -> None:
    recipes = {e["recipe"] for e in MANIFEST.values()}
    assert recipes == {
        "fp32",
        "fp16",
        "int8_static_pt",
        "int8_static_pc",
        "int8_dynamic_pc",
        "int8_dynamic_int4w_pc",
        "int4_pc",
        "int4_group",
    }
    for name, entry in MANIFEST.items():
        assert entry["executorch_runtime"] == "ok", name
        assert entry["delegates"], f"{name}: nothing was delegated"


RUNNERS = ["torch", "executorch"]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("name", NAMES)
def test_matches_executorch_and_eager(name: str, runner: str) -> None:
    """Both XNNPACK runners (ptexec's torch code, ExecuTorch's XNNPACK backend inside
    ptexec's method) against what ExecuTorch+XNNPACK and eager PyTorch returned."""
    if runner == "executorch":
        _et_runtime()
    entry = MANIFEST[name]
    for i, (got, call) in enumerate(zip(_replay(name, xnnpack=runner), _calls(name), strict=True)):
        problem = compare_outputs(got, call["executorch"], *entry["tol_executorch"])
        assert problem is None, f"{name} call {i}: vs ExecuTorch+XNNPACK: {problem}"
        problem = compare_outputs(got, call["eager"], *entry["tol_eager"])
        assert problem is None, f"{name} call {i}: vs eager: {problem}"


@pytest.mark.parametrize("name", NAMES)
def test_matches_executorch_runtime_live(name: str) -> None:
    """The same file through ExecuTorch's runtime here, and through ptexec."""
    rt = _et_runtime()
    method = rt.load_program(DIR / MANIFEST[name]["pte"]).load_method("forward")
    for i, (got, call) in enumerate(zip(_replay(name), _calls(name), strict=True)):
        want = [x.clone() for x in method.execute(call["inputs"])]
        problem = compare_outputs(got, want, *MANIFEST[name]["tol_executorch"])
        assert problem is None, f"{name} call {i}: {problem}"


def _payloads(path: Path) -> list[tuple[int, memoryview]]:
    """(offset in the file, bytes) of each XNNPACK delegate payload of a program."""
    from ptexec.format import program as p

    pte = read_pte(path.read_bytes())
    out = []
    for plan in pte.program.execution_plan:
        for d in plan.delegates:
            if d.id == "XnnpackBackend":
                ref = d.processed
                if ref.location == p.DATA_INLINE:
                    start = pte.program.backend_delegate_data[ref.index].offset
                else:
                    start = pte.segments[ref.index].offset
                out.append((start, pte.delegate_data(ref)))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_describe_payload_matches_flatc(name: str) -> None:
    """Node counts decoded by ptexec equal those flatc decoded with XNNPACK's schema."""
    got = [describe_payload(view) for _, view in _payloads(DIR / MANIFEST[name]["pte"])]
    assert got == [d["node_types"] for d in MANIFEST[name]["delegates"]]


def test_inspect_shows_node_types(capsys: pytest.CaptureFixture[str]) -> None:
    from ptexec.cli import main

    path = str(DIR / MANIFEST["cnn_int8_static_pc"]["pte"])
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "XnnpackBackend" in out
    for node, count in MANIFEST["cnn_int8_static_pc"]["node_types"].items():
        assert re.search(rf"\b{count}\s+{node}\b", out), (node, out)
    assert "run by ExecuTorch's XNNPACK kernels where installed (CPU), else ptexec's" in out
    kinds = len(MANIFEST["cnn_int8_static_pc"]["node_types"])
    assert f"runs all of it ({kinds} node/op types)" in out


# -- coverage --------------------------------------------------------------------------


def _doc_rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            line.startswith("|")
            and len(cells) == 4
            and cells[0]
            and not set(cells[0]) <= {"-", " "}
        ):
            rows[cells[0].strip("`")] = cells[1:]
    rows.pop("node type", None)
    return rows


def test_coverage_table_lists_every_emitted_node_type() -> None:
    """docs/xnnpack_coverage.md: every node type a fixture contains is listed as emitted and
    tested, with fixtures that do contain it; no other node type claims to be emitted."""
    emitted: dict[str, set[str]] = {}
    for name, entry in MANIFEST.items():
        for node in entry["node_types"]:
            emitted.setdefault(node, set()).add(name)
    rows = _doc_rows()
    for node, fixtures in emitted.items():
        assert node in rows, f"{node} missing from the coverage table"
        status, runs, tested = rows[node]
        assert status.startswith("emitted"), node
        assert runs == "yes", node
        named = set(re.findall(r"`([a-z0-9_]+)`", tested))
        assert named and named <= fixtures, f"{node}: {named - fixtures} do not contain it"
    claimed = {n for n, r in rows.items() if r[0].startswith("emitted")}
    assert claimed == set(emitted), claimed ^ set(emitted)


def test_coverage_table_knows_the_whole_schema() -> None:
    from ptexec.delegates.xnnpack.runtime import SUPPORTED_NODE_TYPES
    from ptexec.delegates.xnnpack.schema import NODE_TYPES

    rows = _doc_rows()
    assert set(rows) == set(NODE_TYPES.values())
    for node, (_, runs, _) in rows.items():
        assert (runs == "yes") == (node in SUPPORTED_NODE_TYPES), node


# -- load-time behaviour -----------------------------------------------------------------


def test_float_weights_stay_in_the_file() -> None:
    """fp32 linear weights are used in place: views of the program's memory, not copies."""
    prog = ptexec.load(DIR / MANIFEST["mlp"]["pte"])
    method = prog.load_method("forward", xnnpack="torch")
    lo = torch.frombuffer(prog.pte.data, dtype=torch.uint8).data_ptr()
    hi = lo + len(prog.pte.data)
    runner = next(
        fn
        for st in method.state.chains[0].statements
        for fn in st.env.values()
        if getattr(fn, "__name__", "") == "_xnnpack_run"
    )
    weights = [
        t for t in runner.__globals__.values() if isinstance(t, torch.Tensor) and t.dim() == 2
    ]
    assert weights and all(lo <= t.data_ptr() < hi for t in weights)


def _patched(name: str, node: int, code: int) -> bytes:
    """The fixture's bytes with the type code of node ``node`` of its first payload changed."""
    path = DIR / MANIFEST[name]["pte"]
    data = bytearray(path.read_bytes())
    start, view = _payloads(path)[0]
    from ptexec.delegates.xnnpack.schema import decode_payload

    p = decode_payload(view)
    fb = Buffer(view[p.flatbuffer_offset : p.flatbuffer_offset + p.header.flatbuffer_size])  # type: ignore[union-attr]
    nodes = fb.root().tables(1, "xnodes", lambda t: t)
    assert nodes is not None
    data[start + p.flatbuffer_offset + nodes[node]._field(0)] = code
    return bytes(data)


def test_unknown_node_type_fails_at_load_naming_it() -> None:
    prog = ptexec.load(_patched("mlp", 1, 120))
    with pytest.raises(BackendUnavailableError, match="unknown node type 120"):
        prog.load_method("forward")


def test_schema_node_type_ptexec_cannot_run_fails_at_load_naming_it() -> None:
    prog = ptexec.load(_patched("op_abs", 0, 36))  # ScaledDotProductAttention
    with pytest.raises(BackendUnavailableError, match="ScaledDotProductAttention"):
        prog.load_method("forward", xnnpack="torch")


def test_format_errors_name_the_place_in_the_payload() -> None:
    path = DIR / MANIFEST["op_add"]["pte"]
    data = bytearray(path.read_bytes())
    start, _view = _payloads(path)[0]
    data[start + 4 : start + 8] = b"XH99"  # no header: the payload is read as a bare flatbuffer
    with pytest.raises(PteFormatError) as info:
        ptexec.load(bytes(data)).load_method("forward")
    assert info.value.path == "forward.delegates[0].payload.identifier"


@pytest.mark.parametrize(
    "name", ["mlp", "cnn_int8_static_pc", "op_shapes", "transformer_int4_group"]
)
def test_corrupt_payloads_fail_with_ptexec_errors(name: str) -> None:
    """Random byte changes inside a payload's header and graph: loading and running either
    work or raise a ptexec error, never anything else."""
    path = DIR / MANIFEST[name]["pte"]
    clean = path.read_bytes()
    payloads = _payloads(path)
    inputs = _calls(name)[0]["inputs"]
    rng = random.Random(f"xnnpack-{name}")
    outcomes: dict[str, int] = {}
    for _ in range(60):
        data = bytearray(clean)
        start, view = payloads[rng.randrange(len(payloads))]
        from ptexec.delegates.xnnpack.schema import read_header

        h = read_header(view, "p")
        end = start + (h.flatbuffer_offset + h.flatbuffer_size if h else len(view))
        for _ in range(rng.choice((1, 2, 4))):
            data[rng.randrange(start, end)] = rng.randrange(256)
        try:
            method = ptexec.load(bytes(data)).load_method("forward")
            method.execute(inputs)
            kind = "ok"
        except PtexecError as e:
            kind = type(e).__name__
        outcomes[kind] = outcomes.get(kind, 0) + 1
    assert sum(outcomes.values()) == 60, outcomes


def _graphs_both_ways(fb: bytes, ident: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(decoded with the fast paths, decoded by the table decoders alone), each the
    graph's repr (a NaN bound equals itself there) or the error's type and message."""
    from ptexec.delegates.xnnpack import schema

    def run() -> str:
        try:
            return repr(schema._decode_graph(memoryview(fb), ident, "p"))
        except PteFormatError as e:
            return f"{type(e).__name__}: {e}"

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(schema, "_fast_value", lambda buf, pos, index: None)
        m.setattr(schema, "_fast_node", lambda buf, pos, index: None)
        slow = run()
    return fast, slow


@pytest.mark.parametrize(
    "name", ["mlp", "cnn_int8_static_pc", "op_shapes", "transformer_int4_group", "op_clamp"]
)
def test_fast_graph_decoding_agrees_with_the_table_decoders(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast paths for tensor values and nodes give what the table decoders give, on
    each payload of the fixture and on copies of its graph with bytes changed (the same
    graph, or the same error with the same path)."""
    from ptexec.delegates.xnnpack.schema import decode_payload

    rng = random.Random(f"fast-{name}")
    errors = same = 0
    for _, view in _payloads(DIR / MANIFEST[name]["pte"]):
        p = decode_payload(view)
        start = p.flatbuffer_offset
        end = start + (p.header.flatbuffer_size if p.header else len(view) - start)
        fb = bytes(view[start:end])
        ident = fb[4:8]
        fast, slow = _graphs_both_ways(fb, ident, monkeypatch)
        assert fast == slow and fast.startswith("XnnGraph(")
        for _ in range(80):
            mutated = bytearray(fb)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(8, len(mutated))
                mutated[at] = rng.choice((0, 1, 2, 0x7F, 0xFF, rng.randrange(256)))
            fast, slow = _graphs_both_ways(bytes(mutated), ident, monkeypatch)
            assert fast == slow
            errors += not fast.startswith("XnnGraph(")
            same += fast.startswith("XnnGraph(")
    assert errors and same  # some changes were defects, some decoded


# -- devices -----------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("name", NAMES)
def test_runs_on_cuda(name: str) -> None:
    """Loaded with device_map='cuda', the delegate runs on the GPU (constants moved once at
    load) and agrees with ExecuTorch's CPU results within the fixture's tolerance, widened
    for TF32 and GPU reduction order."""
    entry = MANIFEST[name]
    rtol, atol = entry["tol_executorch"]
    if entry["recipe"] == "fp32":
        rtol, atol = max(rtol, 2e-3), max(atol, 2e-3)
    for i, (got, call) in enumerate(
        zip(_replay(name, device_map="cuda"), _calls(name), strict=True)
    ):
        assert all(x.device.type == "cuda" for x in got if isinstance(x, torch.Tensor))
        problem = compare_outputs([x.cpu() for x in got], call["executorch"], rtol, atol)
        assert problem is None, f"{name} call {i}: {problem}"


def test_dynamic_linears_accumulate_in_int8_on_the_cpu() -> None:
    """Per-token quantized activations times int8/int4 per-channel weights run as integer
    matrix products; block-wise int4 weights run in float."""
    for name, fused in (
        ("mlp_int8_dynamic_pc", True),
        ("mlp_int4_pc", True),
        ("mlp_int4_group", False),
    ):
        method = ptexec.load(DIR / MANIFEST[name]["pte"]).load_method("forward", xnnpack="torch")
        fn = next(
            f
            for st in method.state.chains[0].statements
            for f in st.env.values()
            if getattr(f, "__name__", "") == "_xnnpack_run"
        )
        import linecache

        source = "".join(linecache.cache[fn.__code__.co_filename][2])
        assert ("_qd_linear" in source) == fused, source


# static int8 programs with no float arithmetic between their input's quantization and
# their output's dequantization: ExecuTorch+XNNPACK's integer results, on any CPU
INTEGER_ONLY = [
    "mobilenet_v2_int8_static_pc",
    "cnn_int8_static_pc",
    "cnn_int8_static_pt",
    "dwnet_int8_static_pc",
    "dwnet_int8_static_pt",
    "mlp_int8_static_pc",
    "mlp_int8_static_pt",
]


@pytest.mark.parametrize("name", INTEGER_ONLY)
def test_integer_int8_programs_match_executorch_exactly(name: str) -> None:
    """ptexec's runner, with exact integer accumulation, XNNPACK's requantization rounding,
    fixed-point adds and integer means: every output element is ExecuTorch's."""
    for i, (got, call) in enumerate(zip(_replay(name, xnnpack="torch"), _calls(name), strict=True)):
        for k, (g, want) in enumerate(zip(got, call["executorch"], strict=True)):
            assert torch.equal(g, want), f"{name} call {i} output {k}: {(g - want).abs().max()}"


def test_network_fixtures_are_within_one_output_step() -> None:
    """The real networks' tolerance against ExecuTorch is one step of their quantized
    outputs (no wider)."""
    nets = [n for n, e in MANIFEST.items() if "network" in e["tags"]]
    assert len(nets) == 4
    for name in nets:
        rtol, atol = MANIFEST[name]["tol_executorch"]
        assert rtol == 0 and 0 < atol < MANIFEST[name]["quant_step"], name


def _runner_sources(name: str) -> list[str]:
    import linecache

    method = ptexec.load(DIR / MANIFEST[name]["pte"]).load_method("forward", xnnpack="torch")
    return [
        "".join(linecache.cache[f.__code__.co_filename][2])
        for st in method.state.chains[0].statements
        for f in st.env.values()
        if getattr(f, "__name__", "") == "_xnnpack_run"
    ]


def test_per_token_quantization_is_shared_by_the_converts_of_one_input() -> None:
    """Three Converts of one activation (query, key and value projections) quantize it
    once, and dequantize it once for the three block-wise 4-bit linears."""
    assert MANIFEST["qkv_int4_group"]["node_types"]["Convert"] == 3
    (source,) = _runner_sources("qkv_int4_group")
    assert source.count("_qd8(") == 1 and source.count("_qd_values(") == 1, source
    assert source.count("F.linear(") == 3


def test_int8_elementwise_regions_become_tables() -> None:
    """SiLU on int8 values (dequantize, sigmoid, quantize, multiply by the input) is one
    lookup per activation in the detector, except where its product leaves the delegate
    in float; the results are ExecuTorch's (the fixture)."""
    source = "".join(_runner_sources("yolo_int8_static_pc"))
    tables, floats = source.count("_lut("), source.count("torch.sigmoid(")
    assert tables + floats == MANIFEST["yolo_int8_static_pc"]["node_types"]["Sigmoid"]
    assert tables >= 20, (tables, floats)


def test_lookup_tables_are_generated_code_forgotten_with_their_runner() -> None:
    """The code a table region runs at load is compiled like the graph's: a file name of
    its own naming the payload, its lines in linecache, gone when the method is freed."""
    import gc
    import linecache

    name = "mobilenet_v3_small_int8_static_pc"
    method = ptexec.load(DIR / MANIFEST[name]["pte"]).load_method("forward", xnnpack="torch")
    fns = [
        f
        for st in method.state.chains[0].statements
        for f in st.env.values()
        if getattr(f, "__name__", "") == "_xnnpack_run"
    ]
    files = [n for f in fns for n in f.__globals__["__ptexec_sources__"].filenames]
    tables = [n for n in files if n.endswith(" lookup table>")]
    assert tables and all(".payload lookup table>" in n for n in tables), files
    assert len(set(files)) == len(files)
    for n in tables:
        assert "def _lut_fn(_lut_x):" in "".join(linecache.cache[n][2])
    del method, fns
    gc.collect()
    assert not [n for n in files if n in linecache.cache]


def test_every_supported_node_type_has_an_emitter() -> None:
    from ptexec.delegates.xnnpack.runtime import EMITTERS, SUPPORTED_NODE_TYPES

    assert set(EMITTERS) == SUPPORTED_NODE_TYPES


def test_clamps_join_the_requantization_of_their_producer() -> None:
    """A relu6 Clamp after an int8 convolution becomes the convolution's output bounds."""
    assert MANIFEST["mobilenet_v2_int8_static_pc"]["node_types"]["Clamp"] == 35
    (source,) = _runner_sources("mobilenet_v2_int8_static_pc")
    assert ".clamp(" not in source and ".clamp_(" not in source
