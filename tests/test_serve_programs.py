"""``POST /v1/programs/{method}``: any method over HTTP, micro-batched by ptexec.ray's rules;
every request's rows equal ExecuTorch's runtime on that request alone, in JSON, .npy and
safetensors."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module", params=["dynamic_mlp", "mlp"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    import ptexec
    from ptexec.serve import ProgramService, Server

    name = request.param
    # rows of these methods are independent: requests may share calls
    service = ProgramService(ptexec.load(FIXTURES / f"{name}.pte"), join=True, window=0.02)
    server = Server(None, "127.0.0.1", 0, programs=service).start()
    try:
        yield name, server
    finally:
        server.stop()


def executorch_rows(name: str, rows: np.ndarray) -> np.ndarray:
    """ExecuTorch's runtime on these rows alone (a static batch of 2 padded by repeating)."""
    runtime = pytest.importorskip("executorch.runtime")
    method = (
        runtime.Runtime.get().load_program(str(FIXTURES / f"{name}.pte")).load_method("forward")
    )
    x = torch.from_numpy(rows)
    if name == "mlp":
        out = []
        for i in range(0, len(x), 2):
            chunk = x[i : i + 2]
            padded = (
                torch.cat([chunk, chunk[-1:].expand(2 - len(chunk), -1)])
                if len(chunk) < 2
                else chunk
            )
            out.append(method.execute([padded])[0][: len(chunk)])
        return torch.cat(out).numpy()
    return method.execute([x])[0].numpy()


def test_concurrent_requests_are_batched_and_split_back(served: tuple[str, Any]) -> None:
    name, server = served
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((1 + i % 3, 8)).astype(np.float32) for i in range(12)]

    async def send() -> list[Any]:
        async with httpx.AsyncClient(timeout=60) as client:
            url = server.url + "/v1/programs/forward"
            calls = [client.post(url, json={"inputs": [x.tolist()]}) for x in requests]
            return list(await asyncio.wait_for(asyncio.gather(*calls), 60))

    answers = asyncio.run(send())
    for x, r in zip(requests, answers, strict=True):
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        got = np.asarray(out["data"], dtype=out["dtype"])
        assert got.shape[0] == x.shape[0]
        np.testing.assert_allclose(got, executorch_rows(name, x), rtol=1e-5, atol=1e-6)
    service = server.programs
    assert service.batched_requests == len(requests)
    assert service.batches < len(requests)  # requests within the window shared calls


def test_npy_and_safetensors_bodies(served: tuple[str, Any]) -> None:
    name, server = served
    x = np.arange(24, dtype=np.float32).reshape(3, 8) / 10
    buf = io.BytesIO()
    np.save(buf, x)
    r = httpx.post(
        server.url + "/v1/programs/forward", content=buf.getvalue(),
        headers={"Content-Type": "application/x-npy"}, timeout=60,
    )  # fmt: skip
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy"
    got = np.load(io.BytesIO(r.content), allow_pickle=False)
    np.testing.assert_allclose(got, executorch_rows(name, x), rtol=1e-5, atol=1e-6)
    from safetensors.numpy import load, save

    r = httpx.post(
        server.url + "/v1/programs/forward", content=save({"0": x}),
        headers={"Content-Type": "application/x-safetensors"}, timeout=60,
    )  # fmt: skip
    assert r.status_code == 200
    np.testing.assert_allclose(load(r.content)["0"], executorch_rows(name, x), rtol=1e-5, atol=1e-6)


def test_bad_inputs_get_errors_and_others_still_run(served: tuple[str, Any]) -> None:
    _, server = served
    url = server.url + "/v1/programs/forward"
    r = httpx.post(url, json={"inputs": [[1.0, 2.0]]}, timeout=60)  # rank 1, the method takes 2
    assert r.status_code == 400 and "dims" in r.json()["error"]["message"]
    r = httpx.post(url, json={"inputs": [np.zeros((2, 5)).tolist()]}, timeout=60)  # 5 columns
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url, json={"inputs": []}, timeout=60)
    assert r.status_code == 400
    r = httpx.post(url, content=b"\x93NUMPY garbage", headers={"Content-Type": "application/x-npy"})
    assert r.status_code == 400
    r = httpx.post(server.url + "/v1/programs/nothing", json={"inputs": []}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "method_not_found"
    r = httpx.post(url, json={"inputs": [np.ones((2, 8)).tolist()]}, timeout=60)
    assert r.status_code == 200 and json.loads(r.text)["outputs"][0]["shape"][0] == 2


def test_a_method_without_row_inputs_runs_once_per_request() -> None:
    """A constant method (no inputs: nothing to batch) of an LLM program, called directly."""
    import ptexec
    from llm_support import program
    from ptexec.serve import ProgramService
    from ptexec.serve.programs import decode_inputs, encode_outputs

    prog = ptexec.load(program("portable"))
    service = ProgramService(prog)
    arrays = decode_inputs(b'{"inputs": []}', "application/json", service.infos("get_max_seq_len"))

    async def twice() -> list[list[np.ndarray]]:
        return list(await asyncio.gather(*(service.call("get_max_seq_len", arrays) for _ in "ab")))

    for outputs in asyncio.run(twice()):
        body, kind = encode_outputs(outputs, "application/json")
        want = prog.load_method("get_max_seq_len").execute([])[0]
        assert json.loads(body)["outputs"][0]["data"] == int(want) and kind == "application/json"
    assert service.batches == 0
    service.close()


class _Sequence(torch.nn.Module):
    """Dim 0 is a sequence, not rows: each value depends on the values before it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cumsum(x, 0), x.float().log()


@pytest.fixture(scope="module")
def sequence_server() -> Iterator[Any]:
    import ptexec
    from export_util import export_program
    from ptexec.serve import ProgramService, Server

    n = torch.export.Dim("n", min=1, max=32)
    pte = export_program(_Sequence(), (torch.arange(1, 4),), dynamic_shapes=({0: n},))
    service = ProgramService(ptexec.load(pte), window=0.05)
    server = Server(None, "127.0.0.1", 0, programs=service).start()
    try:
        yield server
    finally:
        server.stop()


def test_requests_are_never_joined_unless_asked(sequence_server: Any) -> None:
    """Concurrent requests to a method whose dim 0 is a sequence each get the method's
    answer on their own values (joined, one client's values would run into another's)."""
    requests = [[10, 20, 30], [1, 2, 3], [5], [7, 8]]

    async def send() -> list[Any]:
        async with httpx.AsyncClient(timeout=60) as client:
            url = sequence_server.url + "/v1/programs/forward"
            calls = [client.post(url, json={"inputs": [x]}) for x in requests]
            return list(await asyncio.wait_for(asyncio.gather(*calls), 60))

    for x, r in zip(requests, asyncio.run(send()), strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == torch.cumsum(torch.tensor(x), 0).tolist()
    assert sequence_server.programs.batches == 0


def test_json_inputs_that_would_change_are_refused_and_non_finite_outputs_named(
    sequence_server: Any,
) -> None:
    url = sequence_server.url + "/v1/programs/forward"
    for bad in ([1.7, 2.0], [2**63], [True, "1"], [None, 1]):
        r = httpx.post(url, json={"inputs": [bad]}, timeout=60)
        assert r.status_code == 400, bad
    r = httpx.post(url, json={"inputs": [[1.0, 2.0]]}, timeout=60)  # integral: as given
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 3]
    # an integer past 2**53 beside a float (numpy reads both as float64, which rounds it)
    big = 2**53 + 1
    r = httpx.post(url, json={"inputs": [[big, 1.0]]}, timeout=60)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [big, big + 1]
    for bad in ([2**63, 1.0], [big, 1.5], [big, float("inf")]):
        r = httpx.post(url, content=json.dumps({"inputs": [bad]}), timeout=60)
        assert r.status_code == 400, bad
    # a big-endian .npy holds the same values
    buf = io.BytesIO()
    np.save(buf, np.array([3, 4], dtype=">i8"))
    r = httpx.post(url, content=buf.getvalue(), headers={"content-type": "application/x-npy"})
    assert r.status_code == 200, r.text
    r = httpx.post(url, json={"inputs": [[0, -1, 1]]}, timeout=60)
    assert r.status_code == 200
    json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert r.json()["outputs"][1]["data"] == ["-inf", "nan", 0.0]


def test_requests_no_route_takes_are_counted(served: tuple[str, Any]) -> None:
    """A request for no route (404) or with a method its route does not take (405) is
    answered, and counted under one label whatever its path (a client's quotes and
    newlines stay out of the metrics)."""
    import httpx

    _, server = served

    def counts() -> dict[int, int]:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        assert "nope" not in text
        found = {404: 0, 405: 0}
        for status in found:
            line = f'ptexec_requests_total{{endpoint="unmatched",status="{status}"}} '
            for row in text.splitlines():
                if row.startswith(line):
                    found[status] = int(row.removeprefix(line))
        return found

    before = counts()
    assert httpx.get(server.url + '/nope"x', timeout=10).status_code == 404
    assert httpx.get(server.url + "/v1/completions", timeout=10).status_code == 405
    assert counts() == {404: before[404] + 1, 405: before[405] + 1}


def test_a_json_number_past_every_float_is_refused_not_read_as_infinity() -> None:
    """1e400 is a finite number that no float holds: refused as 1e39 is for float32
    (JSON parsers read it as infinity, a value the client did not send)."""
    import ptexec
    from ptexec.serve import ProgramService
    from ptexec.serve.programs import decode_inputs
    from ptexec.serve.protocol import ApiError

    service = ProgramService(ptexec.load(FIXTURES / "dynamic_mlp.pte"))
    infos = service.infos("forward")
    for big in ("1e39", "1e400", "-1e400"):
        body = b'{"inputs": [[[' + big.encode() + b", 0, 0, 0, 0, 0, 0, 0]]]}"
        with pytest.raises(ApiError) as e:
            decode_inputs(body, "application/json", infos)
        assert e.value.status == 400, big
    (x,) = decode_inputs(b'{"inputs": [[[3e38, 0, 0, 0, 0, 0, 0, 0]]]}', "", infos)
    assert x.dtype == np.float32 and x[0, 0] == np.float32(3e38)
    service.close()


def test_a_stateful_method_is_not_served() -> None:
    import ptexec
    from ptexec.serve import ProgramService, Server

    service = ProgramService(ptexec.load(FIXTURES / "stateful.pte"), join=True)
    server = Server(None, "127.0.0.1", 0, programs=service).start()
    try:
        r = httpx.post(server.url + "/v1/programs/forward", json={"inputs": [[1.0]]}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "stateful_method"
    finally:
        server.stop()


def test_joined_requests_of_other_dtypes_or_scalars_run_apart() -> None:
    """With join, requests whose arrays differ in dtype run in calls of their own (joined,
    an int64 request would turn a float32 one into float64 and both would be refused); a
    scalar input takes a JSON number."""
    import ptexec
    from export_util import export_program
    from ptexec.serve import ProgramService

    class Scaled(torch.nn.Module):
        def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
            return x * k

    service = ProgramService(ptexec.load(FIXTURES / "dynamic_mlp.pte"), join=True, window=0.05)
    x = np.ones((2, 8), np.float32)

    async def both() -> list[Any]:
        from ptexec.serve.programs import decode_inputs

        infos = service.infos("forward")
        buf = io.BytesIO()
        np.save(buf, x.astype(np.int64))
        ints = decode_inputs(buf.getvalue(), "application/x-npy", infos)
        floats = decode_inputs(json.dumps({"inputs": [x.tolist()]}).encode(), "", infos)
        return list(
            await asyncio.gather(
                service.call("forward", ints), service.call("forward", floats),
                return_exceptions=True,
            )
        )  # fmt: skip

    ints, floats = asyncio.run(both())
    want = ptexec.load(FIXTURES / "dynamic_mlp.pte").load_method().execute([torch.from_numpy(x)])
    for got in (ints, floats):  # (integers that float32 holds exactly: converted)
        assert not isinstance(got, BaseException), got
        np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-6)
    service.close()
    scaled = ProgramService(ptexec.load(export_program(Scaled(), (torch.ones(3), 2))), join=True)
    from ptexec.serve.programs import decode_inputs

    arrays = decode_inputs(b'{"inputs": [[1.0, 2.0, 3.0], 2]}', "", scaled.infos("forward"))
    (out,) = asyncio.run(scaled.call("forward", arrays))
    np.testing.assert_array_equal(out, [2.0, 4.0, 6.0])
    scaled.close()


def test_a_method_whose_name_has_a_slash_is_reachable() -> None:
    """A method name is any string: ``a/b`` is reached at ``/v1/programs/a/b`` (or with
    the slash escaped), and a name the program lacks is a 404 naming it."""
    pytest.importorskip("executorch")
    from executorch.exir import to_edge

    import ptexec
    from ptexec.serve import ProgramService, Server

    ep = torch.export.export(_Sequence(), (torch.arange(1, 4),))
    pte = bytes(to_edge({"encoder/cumsum": ep}).to_executorch().buffer)
    server = Server(None, "127.0.0.1", 0, programs=ProgramService(ptexec.load(pte))).start()
    try:
        for path in ("encoder/cumsum", "encoder%2Fcumsum"):
            r = httpx.post(f"{server.url}/v1/programs/{path}", json={"inputs": [[1, 2, 3]]})
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [1, 3, 6]
        r = httpx.post(f"{server.url}/v1/programs/encoder", json={"inputs": [[1, 2, 3]]})
        assert r.status_code == 404 and "encoder" in r.text
    finally:
        server.stop()


class _Halves(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 3).to(torch.bfloat16)


@pytest.mark.parametrize("join", [False, True])
def test_bfloat16_outputs_are_answered_in_float32(join: bool) -> None:
    """numpy has no bfloat16: such an output is answered as float32, which holds it exactly
    (without joined rows the request failed)."""
    import ptexec
    from export_util import export_program
    from ptexec.serve import ProgramService, Server

    n = torch.export.Dim("n", min=1, max=8)
    pte = export_program(_Halves(), (torch.ones(2, 3),), dynamic_shapes=({0: n},))
    server = Server(None, "127.0.0.1", 0, programs=ProgramService(ptexec.load(pte), join=join))
    server.start()
    try:
        x = [[0.1, 0.2, 0.3], [1.0, 2.0, 1e10]]
        r = httpx.post(server.url + "/v1/programs/forward", json={"inputs": [x]}, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        want = (torch.tensor(x) * 3).to(torch.bfloat16).float()
        assert out["dtype"] == "float32" and out["data"] == want.tolist()
    finally:
        server.stop()


def test_values_one_joined_request_cannot_take_refuse_that_request_alone() -> None:
    """Joined, a request whose values its input's dtype cannot hold (int64 2**24 + 1 into
    float32) is refused alone; the request joined with it gets its answer."""
    import ptexec
    from ptexec.serve import ProgramService
    from ptexec.serve.programs import decode_inputs

    service = ProgramService(ptexec.load(FIXTURES / "dynamic_mlp.pte"), join=True, window=0.05)
    infos = service.infos("forward")
    good, bad = np.ones((2, 8), np.int64), np.ones((1, 8), np.int64)
    bad[0, 0] = 2**24 + 1

    def npy(a: np.ndarray) -> list[np.ndarray]:
        buf = io.BytesIO()
        np.save(buf, a)
        return decode_inputs(buf.getvalue(), "application/x-npy", infos)

    async def both() -> list[Any]:
        calls = [service.call("forward", npy(good)), service.call("forward", npy(bad))]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    ok, refused = asyncio.run(both())
    assert service.batches >= 1
    want = (
        ptexec.load(FIXTURES / "dynamic_mlp.pte")
        .load_method()
        .execute([torch.from_numpy(good).float()])
    )
    assert not isinstance(ok, BaseException), ok
    np.testing.assert_allclose(ok[0], want[0].numpy(), rtol=1e-6)
    assert isinstance(refused, Exception) and "change in float32" in str(refused)
    service.close()


@pytest.mark.parametrize(
    "flags", [["--timeout", "0.001"], ["--max-queue", "0"], ["--max-sessions", "4"]]
)
def test_limits_nothing_would_honour_are_refused(
    flags: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Serving a program's methods alone, the limits of generations and transcriptions
    bound nothing (a method call is not stopped part-way, nor queued by them): the command
    says so instead of serving without them."""
    from ptexec.cli import main
    from ptexec.serve import Server

    started: list[Any] = []
    monkeypatch.setattr(Server, "run", lambda self: started.append(self))
    assert main(["serve", str(FIXTURES / "mlp.pte"), "--port", "0", *flags]) == 2
    assert not started
    assert flags[0] in capsys.readouterr().err
    assert main(["serve", str(FIXTURES / "mlp.pte"), "--port", "0"]) == 0
    assert len(started) == 1


@pytest.mark.parametrize(
    "flags",
    [
        ["--chat-template", "template.jinja"],
        ["--generation-config", "generation_config.json"],
        ["--batch-window-ms", "50"],
        ["--join-rows", "--tokenizer", "tokenizer.json"],
    ],
)
def test_options_of_a_service_not_served_are_refused(
    flags: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chat template is an LLM's, a generation config a speech model's, joining rows
    and its window the methods' (the window only with --join-rows): given where nothing
    would honour them, the command says so instead of serving without them."""
    from ptexec.cli import main
    from ptexec.serve import Server

    started: list[Any] = []
    monkeypatch.setattr(Server, "run", lambda self: started.append(self))
    assert main(["serve", str(FIXTURES / "mlp.pte"), "--port", "0", *flags]) == 2
    assert not started
    assert flags[0] in capsys.readouterr().err


def test_joined_rows_take_their_window(monkeypatch: pytest.MonkeyPatch) -> None:
    from ptexec.cli import main
    from ptexec.serve import Server

    started: list[Any] = []
    monkeypatch.setattr(Server, "run", lambda self: started.append(self))
    argv = ["serve", str(FIXTURES / "mlp.pte"), "--port", "0", "--join-rows"]
    assert main([*argv, "--batch-window-ms", "50"]) == 0
    assert started[-1].programs.join and started[-1].programs.window == 0.05
    assert main(argv) == 0
    assert started[-1].programs.window == 0.002


@pytest.mark.parametrize("compile", [False, True])
def test_a_ray_replica_loads_as_ptexec_serve_compile_does(
    compile: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray Serve replica built with ``compile=True`` loads the engine's sessions and the
    methods it serves as ``ptexec serve --compile`` does: ``compile="background"``, so that
    it answers at once (the methods ignored the option, and the engine compiled before the
    replica answered anything)."""
    import ptexec.serve
    from ptexec.ray.serve import _Replica

    seen: dict[str, dict[str, Any]] = {}

    class Recorded:
        def __init__(self, name: str, program: Any, **kwargs: Any) -> None:
            seen[name] = kwargs
            self.program = program

    monkeypatch.setattr(
        ptexec.serve, "Engine", lambda model, tok, **kw: Recorded("engine", model, **kw)
    )
    monkeypatch.setattr(
        ptexec.serve, "ProgramService", lambda p, **kw: Recorded("methods", p, **kw)
    )
    _Replica(str(FIXTURES / "mlp.pte"), "tokenizer.json", programs=True, compile=compile)
    expected = "background" if compile else False
    assert seen["engine"]["compile"] == expected
    assert seen["methods"].get("compile", False) == expected
    from ptexec.llm.decoder import load_options

    cli = load_options(None, expected)  # what ptexec serve hands the methods
    assert {k: v for k, v in seen["methods"].items() if k not in ("join", "window")} == cli
