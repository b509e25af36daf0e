"""The memory plan: summary numbers against the file, lifetimes, the picture; ``ptexec plan``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import fixture_calls, fixture_paths, load_manifest, load_options
from ptexec.cli import main
from ptexec.format import program as p
from ptexec.plan import MemoryPlan, memory_plan

MANIFEST = load_manifest()
ALL = list(MANIFEST)
RUNNABLE = [name for name, entry in MANIFEST.items() if entry.get("runs", True)]
STATE_TAGS = {"stateful", "mutable_init", "shared_state", "llm"}


def _program(name: str) -> ptexec.Program:
    pte, ptd = fixture_paths(name)
    return ptexec.load(pte, data_path=ptd)


def _device_map(name: str) -> Any:
    return "cpu" if MANIFEST[name].get("load_error") == "PteFormatError" else None


def _plans(name: str) -> list[tuple[p.ExecutionPlan, MemoryPlan]]:
    prog = _program(name)
    return [
        (plan, memory_plan(prog, plan.name, device_map=_device_map(name)))
        for plan in prog.pte.program.execution_plan
    ]


@pytest.mark.parametrize("name", ALL)
def test_summary_numbers_are_the_files(name: str) -> None:
    """Buffer sizes are non_const_buffer_sizes; every planned value sits in exactly one
    tensor at its allocation_info offset with its byte size; peak bytes live equal a
    brute-force count of the bytes covered at every instruction."""
    for plan, mp in _plans(name):
        assert [b.size for b in mp.buffers] == list(plan.non_const_buffer_sizes[1:])
        assert [b.index for b in mp.buffers] == list(range(1, len(plan.non_const_buffer_sizes)))
        assert mp.planned_bytes == sum(plan.non_const_buffer_sizes[1:])
        n = sum(len(c.instructions) for c in plan.chains)
        assert mp.num_instructions == n
        placed: dict[int, Any] = {}
        for t in mp.tensors:
            for j in t.values:
                assert j not in placed
                placed[j] = t
        for j, v in enumerate(plan.values):
            if isinstance(v, p.Tensor) and v.allocation_info is not None:
                t = placed.pop(j)
                assert (t.buffer, t.offset, t.nbytes) == (
                    v.allocation_info.memory_id,
                    v.allocation_info.memory_offset,
                    v.nbytes,
                )
        assert not placed
        for b in mp.buffers:
            for t in b.tensors:
                assert t.buffer == b.index and t.offset >= 0 and t.end <= b.size
                if t.first is not None:
                    assert 0 <= t.first <= t.last < max(n, 1)  # type: ignore[operator]
            # brute force: bytes covered by live tensors, instruction by instruction
            live = []
            for step in range(max(n, 1)):
                covered = bytearray(b.size)
                for t in b.tensors:
                    if t.first is not None and t.first <= step <= t.last:  # type: ignore[operator]
                        covered[t.offset : t.end] = b"\x01" * t.nbytes
                live.append(sum(covered))
            assert b.live == live
            assert b.peak == max(live)
            assert b.utilization == pytest.approx(max(live) / b.size if b.size else 0.0)
        text = mp.summary()
        for b in mp.buffers:
            assert f"buffer {b.index} on {b.device}: {b.size} bytes" in text
            assert f"peak {b.peak} bytes live" in text


@pytest.mark.parametrize("name", ALL)
def test_state_only_where_the_program_keeps_state(name: str) -> None:
    kinds = {t.kind for _, mp in _plans(name) for t in mp.tensors}
    if STATE_TAGS & set(MANIFEST[name]["tags"]):
        assert "state" in kinds
    else:
        assert "state" not in kinds
    for plan, mp in _plans(name):
        n = max(mp.num_instructions - 1, 0)
        for t in mp.tensors:
            if t.kind == "state":
                assert (t.first, t.last) == (0, n)
            if t.kind in ("input", "input/output"):
                assert t.first == 0
            if t.kind in ("output", "input/output"):
                assert t.last == n
            assert any(j in plan.inputs for j in t.values) == (t.kind in ("input", "input/output"))


@pytest.mark.parametrize("name", RUNNABLE)
def test_lifetimes_cover_what_the_trace_touches(name: str) -> None:
    """Every instruction the trace (unoptimized, the kernels' own account of what they
    write) records writing a planned value runs within that value's lifetime."""
    prog = _program(name)
    plans = {mp.method: mp for _, mp in _plans(name)}
    methods: dict[str, ptexec.Method] = {}
    for call in fixture_calls(name):
        name_m = call["method"]
        m = methods.get(name_m) or methods.setdefault(
            name_m, prog.load_method(name_m, optimize=False, **load_options(name))
        )
        inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in call["inputs"]]
        tr = m.trace(inputs)
        where = {j: t for t in plans[name_m].tensors for j in t.values}
        offsets = [0]
        for c in m.state.plan.chains:
            offsets.append(offsets[-1] + len(c.instructions))
        for r in tr.records:
            g = offsets[r.chain] + r.index
            for w in r.writes:
                t = where.get(w.index)
                if t is not None and w.stats is not None and w.stats.numel:
                    assert t.first is not None and t.first <= g <= t.last, (r.index, w.index, t)  # type: ignore[operator]


def _nonblank_png(path: Path) -> None:
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 800
    rgb = img[..., :3]
    white = (rgb > 0.97).all(axis=-1)
    assert 0.05 < 1 - white.mean() < 0.95  # something drawn, not all ink
    colors = {tuple(c) for c in (rgb.reshape(-1, 3)[::97] * 255).astype(int).tolist()}
    assert len(colors) > 5


@pytest.mark.parametrize(
    "name", ["transformer", "h2d_copy", "delegate_device", "scan", "llama_sdpa"]
)
def test_picture(name: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for plan, mp in _plans(name):
        png = tmp_path / f"{plan.name}.png"
        mp.draw(png)
        assert png.stat().st_size > 10_000
        _nonblank_png(png)
        svg = tmp_path / f"{plan.name}.svg"
        mp.draw(svg, title="a title")
        text = svg.read_text()
        assert text.lstrip().startswith("<?xml") and "<svg" in text and "a title" in text
        drawn = sum(1 for t in mp.tensors if t.first is not None and t.nbytes)
        assert text.count("<path") >= drawn


def test_without_matplotlib_the_text_still_works(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    ((_, mp),) = _plans("mlp")
    assert "buffer 1" in mp.summary()
    with pytest.raises(ImportError, match=r"pip install '\.\[plot\]'"):
        mp.draw(tmp_path / "x.png")
    pte = str(fixture_paths("mlp")[0])
    assert main(["plan", pte]) == 0
    assert "largest tensors" in capsys.readouterr().out
    assert main(["plan", pte, "--out", str(tmp_path / "x.png")]) == 1
    assert "matplotlib" in capsys.readouterr().err


@pytest.mark.parametrize("name", ALL)
def test_cli_plan(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, ptd = fixture_paths(name)
    args = [str(pte)] + (["--data", str(ptd)] if ptd else [])
    if _device_map(name):
        args += ["--device-map", "cpu"]
    assert main(["plan", *args]) == 0
    out = capsys.readouterr().out
    for method in MANIFEST[name]["methods"]:
        assert f"method '{method}'" in out
    assert main(["plan", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    prog = _program(name)
    assert {d["method"] for d in data} == set(prog.method_names)
    for d in data:
        plan = next(pl for pl in prog.pte.program.execution_plan if pl.name == d["method"])
        assert [b["size"] for b in d["buffers"]] == list(plan.non_const_buffer_sizes[1:])


def test_cli_plan_picture_per_method(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    pte = str(fixture_paths("two_method_state")[0])
    assert main(["plan", pte, "--out", str(tmp_path / "plan.png")]) == 0
    assert sorted(f.name for f in tmp_path.iterdir()) == ["plan.other.png", "plan.step.png"]
    assert main(["plan", pte, "--method", "step", "--out", str(tmp_path / "one.svg")]) == 0
    assert (tmp_path / "one.svg").stat().st_size > 5_000
    assert main(["plan", pte, "--method", "nope"]) == 1


def test_cli_plan_top_lists_as_many_tensors_in_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    """``--top N`` with ``--json`` lists the N largest tensors (the rows the text lists)
    and the first N unplanned ones, and says how many there are; without ``--top`` the
    JSON lists every tensor (the text its 10 largest)."""
    pte = str(fixture_paths("transformer")[0])
    assert main(["plan", pte, "--json"]) == 0
    (whole,) = json.loads(capsys.readouterr().out)
    assert len(whole["tensors"]) > 3
    assert main(["plan", pte, "--json", "--top", "3"]) == 0
    (cut,) = json.loads(capsys.readouterr().out)
    key = lambda t: (-t["nbytes"], t["buffer"], t["offset"])  # noqa: E731
    assert cut["tensors"] == sorted(whole["tensors"], key=key)[:3]
    assert cut["unplanned"] == whole["unplanned"][:3]
    assert cut["num_tensors"] == whole["num_tensors"] == len(whole["tensors"])
    assert main(["plan", pte, "--top", "3"]) == 0
    text = capsys.readouterr().out
    listed = text.split("largest tensors:\n")[1].splitlines()[1:]
    assert [int(row.split()[0]) for row in listed] == [t["nbytes"] for t in cut["tensors"]]
