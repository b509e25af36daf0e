"""Outputs that contradict the program's declaration are refused, never returned.

The files in tests/fixtures/xnnpack_bad (made by scripts/make_bad_xnnpack_outputs.py from
the XNNPACK fixtures, one field changed each) make a delegate compute an output the
program does not declare: a concatenation along the wrong axis, a pooling window of
another width, an output value of another dtype, a dynamic output beyond its bound. Each
ran and returned the contradicting tensor before; now the static ones fail at load with a
PteFormatError naming the payload's value, the dynamic one at the call with an
ExecutionError, with either XNNPACK runner. The same check guards every method's outputs
(a portable kernel resizing a static output), and :func:`shapes.infer_dims` is checked
against what torch computes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from ptexec.delegates.xnnpack import schema as s
from ptexec.delegates.xnnpack.shapes import infer_dims

ROOT = Path(__file__).resolve().parent.parent
BAD = ROOT / "tests" / "fixtures" / "xnnpack_bad"
GOOD = ROOT / "tests" / "fixtures" / "xnnpack"
MANIFEST: dict[str, Any] = json.loads((BAD / "manifest.json").read_text())


def _runners() -> list[str]:
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    return ["torch"] + ([] if executorch_unavailable() else ["executorch"])


def _calls(fixture: str) -> list[dict[str, Any]]:
    return torch.load(GOOD / f"{fixture}.io.pt", weights_only=True)["calls"]  # type: ignore[no-any-return]


def test_the_bad_files_are_their_fixtures_with_one_field_changed() -> None:
    for name, entry in MANIFEST.items():
        bad = (BAD / f"{name}.pte").read_bytes()
        good = (GOOD / f"{entry['fixture']}.pte").read_bytes()
        assert len(bad) == len(good)
        diff = [i for i in range(len(bad)) if bad[i] != good[i]]
        assert diff and diff[-1] - diff[0] < 8, name  # one field
        assert entry["was"] != entry["now"]


def test_the_unchanged_fixtures_run() -> None:
    """Not vacuous: the fixtures these files come from load and run with both runners."""
    for entry in MANIFEST.values():
        for runner in _runners():
            m = ptexec.load(GOOD / f"{entry['fixture']}.pte").load_method("forward", xnnpack=runner)
            m.execute(_calls(entry["fixture"])[0]["inputs"])


@pytest.mark.parametrize("runner", ["torch", "executorch"])
@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_contradicting_output_is_refused(name: str, runner: str) -> None:
    if runner not in _runners():
        pytest.skip("ExecuTorch's XNNPACK backend is not available here")
    entry = MANIFEST[name]
    expect = entry["expect"]
    prog = ptexec.load(BAD / f"{name}.pte")
    if expect["stage"] == "load":
        with pytest.raises(ptexec.PteFormatError) as info:
            prog.load_method("forward", xnnpack=runner)
        assert info.value.path == expect["path"]
        assert re.search(expect["match"], str(info.value)), str(info.value)
        return
    method = prog.load_method("forward", xnnpack=runner)
    pattern = expect["match"]
    if runner == "executorch":
        # past the bound's element count, ExecuTorch's own resize refuses it first
        pattern += r"|method->execute\(\) failed"
    for call in _calls(entry["fixture"]):
        # every call fails, before anything is returned; the method stays sound
        with pytest.raises(ptexec.ExecutionError, match=pattern) as info:
            method.execute(call["inputs"])
        assert info.value.operator == "delegate:XnnpackBackend"


def test_a_kernel_shrinking_a_static_output_is_an_execution_error() -> None:
    """A portable program from the fuzz corpus whose kernel resizes its static output
    [4, 2, 3] to [1, 2, 3]: the call fails naming the output, in both call paths (the
    generated fast call and the general one), and later calls fail with typed errors."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "fuzz_loader", ROOT / "scripts" / "fuzz_loader.py"
    )
    assert spec is not None and spec.loader is not None
    fl = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_loader", fl)
    spec.loader.exec_module(fl)
    path = ROOT / "tests" / "fuzz_corpus" / "output-map-98a8991766.pte"
    pte, ptd, inputs, _ = fl.corpus_files(path)
    args = inputs["forward"]
    pattern = r"output 0 \(value \d+\) is float32\[4, 2, 3\] \(static\) in the program, but execution left sizes \[1, 2, 3\]"
    for kwargs in ({}, {"outputs": "view"}):
        method = ptexec.load(pte, data_path=ptd).load_method("forward")
        with pytest.raises(ptexec.ExecutionError, match=pattern):
            method.execute([a.clone() for a in args], **kwargs)
        with pytest.raises(ptexec.ExecutionError):
            method.execute([a.clone() for a in args], **kwargs)


# -- shape inference -----------------------------------------------------------------------


def _payload(name: str) -> tuple[s.XnnPayload, list[Any]]:
    from ptexec.format import program as p

    prog = ptexec.load(GOOD / f"{name}.pte")
    plan = prog.pte.program.execution_plan[0]
    (call,) = [i for i in plan.chains[0].instructions if isinstance(i, p.DelegateCall)][:1]
    payload = s.decode_payload(
        prog.pte.delegate_data(plan.delegates[call.delegate_index].processed)
    )
    return payload, [plan.values[a] for a in call.args]


@pytest.mark.parametrize(
    "name", ["op_pools", "op_conv_shapes", "op_conv_transpose", "op_shapes", "cnn"]
)
def test_inferred_dims_are_what_the_graph_computes(name: str) -> None:
    """infer_dims from the program's static inputs gives every external output the dims
    of the tensor the fixture's ExecuTorch run returned (in the tensor's dim order)."""
    payload, tensors = _payload(name)
    known = {
        v.id: tuple(tensors[v.external_id].sizes[d] for d in tensors[v.external_id].dim_order)
        or tuple(v.dims)
        for v in payload.graph.values
        if v.is_input
    }
    dims = infer_dims(payload, known)
    outs = [v for v in payload.graph.values if v.is_output]
    assert outs
    for v in outs:
        t = tensors[v.external_id]
        assert dims[v.id] == tuple(t.sizes[d] for d in t.dim_order), (name, v.index)


def test_inconsistent_node_fails_at_load_naming_it() -> None:
    """A convolution whose filter takes other channels than its input has: no shape
    exists, and the node is named."""
    payload, tensors = _payload("op_conv2d")
    conv = next(n for n in payload.graph.nodes if n.type == "Conv2d")
    x = payload.graph.by_id[conv["input1_id"]]
    known: dict[int, Any] = {
        v.id: tuple(tensors[v.external_id].sizes[d] for d in tensors[v.external_id].dim_order)
        for v in payload.graph.values
        if v.is_input
    }
    assert x.id in known or any(n.outputs == (x.id,) for n in payload.graph.nodes)
    # one more channel in the (NCHW) input than the filter takes
    wrong = {vid: (d[0], d[1] + 1, *d[2:]) if len(d) == 4 else d for vid, d in known.items()}
    with pytest.raises(ptexec.PteFormatError, match=r"xnodes\[\d+\]\.Conv2d: input dims"):
        infer_dims(payload, wrong)
