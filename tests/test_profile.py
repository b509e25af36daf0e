"""Method.profile: per-instruction times, operator tables, Chrome traces; ``ptexec profile``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import (
    compare_outputs,
    fixture_calls,
    fixture_paths,
    load_manifest,
    load_options,
    missing_devices,
)
from ptexec.cli import main
from ptexec.format import program as p

MANIFEST = load_manifest()
RUNNABLE = [name for name, entry in MANIFEST.items() if entry.get("runs", True)]


def _method(name: str, method: str | None = None, **options: Any) -> ptexec.Method:
    pte, ptd = fixture_paths(name)
    prog = ptexec.load(pte, data_path=ptd)
    return prog.load_method(method or prog.method_names[0], **load_options(name), **options)


def _straight(m: ptexec.Method) -> bool:
    return not any(
        isinstance(ins, p.JumpFalseCall) for c in m.state.plan.chains for ins in c.instructions
    )


def _names(m: ptexec.Method) -> list[str]:
    return [name for c in m.state.chains for name in c.names]


@pytest.mark.parametrize("name", RUNNABLE)
def test_chrome_trace_has_one_event_per_instruction(name: str, tmp_path: Path) -> None:
    call = fixture_calls(name)[0]
    m = _method(name, call["method"])
    prof = m.profile(
        [x.clone() if isinstance(x, torch.Tensor) else x for x in call["inputs"]],
        repeat=2,
        warmup=0,
        compare=False,
    )
    path = tmp_path / "trace.json"
    prof.save_chrome_trace(path)
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert all(
        isinstance(e["ts"], float | int)
        and e["dur"] >= 0
        and {"pid", "tid", "name", "cat"} <= set(e)
        for e in spans
    )
    per_call = [
        [e for e in spans if "instruction" in e["args"] and e["args"]["call"] == k]
        for k in range(2)
    ]
    # one event per executed instruction, in order, named by its operator
    tr = m.trace([x.clone() if isinstance(x, torch.Tensor) else x for x in call["inputs"]])
    executed = [(r.index, r.name) for r in tr.records]
    if _straight(m):  # a loop may run a different number of times when state changes
        for events_k in per_call:
            assert [(e["args"]["instruction"], e["name"]) for e in events_k] == executed
            assert [e["ts"] for e in events_k] == sorted(e["ts"] for e in events_k)
        assert [(e.index, e.name) for e in prof.events if e.index >= 0 and e.call == 0] == executed
    tracks = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    assert set(tracks) == {"call", "instructions", "device copies"}
    for e in spans:
        if e["cat"] == "device_copy":
            assert e["tid"] == tracks["device copies"] and e["name"].startswith("et_copy::")
        elif "instruction" in e["args"]:
            assert e["tid"] == tracks["instructions"]
    phases = [e["name"] for e in spans if e["cat"] == "phase" and e["args"]["call"] == 0]
    assert phases == ["bind inputs", "run", "collect outputs"]


def test_device_copies_are_their_own_events() -> None:
    m = _method("h2d_copy")
    call = fixture_calls("h2d_copy")[0]
    prof = m.profile(call["inputs"], repeat=3)
    copies = [e for e in prof.events if e.category == "device_copy"]
    n_copy = sum(name.startswith("et_copy::") for name in _names(m))
    assert n_copy == 3 and len(copies) == 3 * n_copy
    assert all(e.args["bytes"] == 48 for e in copies)
    binding = [e for e in prof.events if e.category == "binding"]
    assert len(binding) == 3 and binding[0].args["actions"] == ["copy", "copy"]
    trace = prof.chrome_trace()
    assert sum(e.get("cat") == "device_copy" for e in trace["traceEvents"]) == 9


def test_operator_table() -> None:
    m = _method("transformer")
    call = fixture_calls("transformer")[0]
    prof = m.profile(call["inputs"], repeat=4)
    rows = prof.by_operator()
    counts = Counter(_names(m))
    assert {r.name: r.count for r in rows} == counts
    assert [r.total for r in rows] == sorted((r.total for r in rows), reverse=True)
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert all(r.min <= r.mean * 1.000001 or r.count > 1 for r in rows)
    by_ins = prof.by_instruction()
    assert sorted(r.index for r in by_ins) == list(range(55))
    assert all(r.count == 1 for r in by_ins)
    text = prof.table(top=5)
    assert rows[0].name in text and "... " in text and "plain execute" in text
    assert "instruction" in prof.table(by="instruction").splitlines()[0]
    with pytest.raises(ValueError, match="by must be"):
        prof.table(by="nothing")
    assert compare_outputs(prof.outputs, m.execute(call["inputs"]), 0, 0) is None
    assert len(prof.call_times) == len(prof.execute_times) == 4
    assert prof.instruction_time > 0


def test_profile_advances_state_like_execute() -> None:
    """A stateful program counts its calls under profile too."""
    m = _method("two_method_state", "step")
    x = torch.ones(8)
    m.profile([x], repeat=3, warmup=1, compare=False)
    (out,) = m(x)
    assert int(out.reshape(-1)[0]) == 5


def test_profile_rejects_zero_repeats() -> None:
    with pytest.raises(ValueError, match="repeat"):
        _method("mlp").profile([torch.randn(2, 8)], repeat=0)


@pytest.mark.cuda
def test_profile_synchronizes_on_cuda() -> None:
    m = _method("gpu_mlp", transfers="allow")
    call = fixture_calls("gpu_mlp")[0]
    prof = m.profile(call["inputs"], repeat=2)
    assert prof.synchronized
    assert "synchronized" in prof.summary()


@pytest.mark.parametrize("name", RUNNABLE)
def test_cli_profile(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, ptd = fixture_paths(name)
    args = [str(pte)] + (["--data", str(ptd)] if ptd else [])
    if missing_devices(name):
        args += ["--device-map", "cpu"]
    out = tmp_path / "t.json"
    for method in MANIFEST[name]["methods"]:
        assert (
            main(
                [
                    "profile",
                    *args,
                    "--method",
                    method,
                    "--repeat",
                    "2",
                    "--chrome-trace",
                    str(out),
                    "--by",
                    "both",
                ]
            )
            == 0
        )
        text = capsys.readouterr().out
        assert "share" in text and "Chrome trace saved" in text
        assert json.loads(out.read_text())["traceEvents"]
