"""Running the application with uvicorn: binding, readiness, draining on SIGTERM.

:class:`Server` binds its socket first (so port 0 gives a free port, known before the first
request), then serves. SIGTERM or SIGINT drains: new requests get 503 and ``/health`` says
``draining``, running and queued ones finish, then the server exits (after
``drain_timeout`` seconds at most; a second signal exits at once).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

from .app import DEFAULT_MAX_BODY, create_app
from .engine import Engine
from .programs import ProgramService
from .speech import SpeechService

__all__ = ["Server"]

log = logging.getLogger("ptexec.serve")


class Server:
    """``engine`` (an LLM; None: none), ``programs`` (program methods; None: none) and
    ``speech`` (a speech model; None: none) served over HTTP on ``host:port``
    (``port=0``: a free one, see :attr:`port`). 127.0.0.1 unless told otherwise."""

    def __init__(
        self,
        engine: Engine | None,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        drain_timeout: float = 30.0,
        log_level: str = "warning",
        extra_routes: list[Any] | None = None,
        programs: ProgramService | None = None,
        speech: SpeechService | None = None,
    ) -> None:
        import uvicorn

        if engine is None and programs is None and speech is None:
            raise ValueError("a server needs an engine, program methods or a speech model")
        self.engine = engine
        self.programs = programs
        self.speech = speech
        self.services: list[Any] = [s for s in (engine, programs, speech) if s is not None]
        self.drain_timeout = drain_timeout
        self.app = create_app(
            engine,
            programs=programs,
            api_key=api_key,
            max_body_bytes=max_body_bytes,
            extra_routes=extra_routes,
            speech=speech,
        )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level=log_level,
            timeout_graceful_shutdown=int(drain_timeout) + 1,
            lifespan="off",
        )
        self._uvicorn = _Uvicorn(config, self)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """The server's base URL (``http://host:port``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve until drained by a signal (blocking; installs signal handlers)."""
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._uvicorn.serve(sockets=[self._socket])
        finally:
            for service in self.services:
                service.close()

    def start(self, timeout: float = 30.0) -> Server:
        """Serve on a background thread; returns once the server accepts connections."""

        def target() -> None:
            asyncio.run(self._serve())

        self._thread = threading.Thread(target=target, name="ptexec-serve", daemon=True)
        self._thread.start()
        waited = 0.0
        while not self._uvicorn.started and waited < timeout:
            if not self._thread.is_alive():
                raise RuntimeError("the server failed to start (see its log)")
            threading.Event().wait(0.02)
            waited += 0.02
        if not self._uvicorn.started:
            raise RuntimeError(f"the server did not start within {timeout} s")
        return self

    def drain(self) -> None:
        """Refuse new requests, finish the running ones, then stop (any thread)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._uvicorn.begin_drain)

    def stop(self, timeout: float = 30.0) -> None:
        """:meth:`drain` and wait for the background thread to end."""
        self.drain()
        if self._thread is not None:
            self._thread.join(timeout)


def _uvicorn_server() -> type:
    import uvicorn

    return uvicorn.Server


class _Uvicorn(_uvicorn_server()):  # type: ignore[misc]
    """uvicorn's server with draining in front of its shutdown."""

    def __init__(self, config: Any, owner: Server) -> None:
        super().__init__(config)
        self._owner = owner
        self._draining_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        # the signal is handled here: uvicorn would raise it again after its shutdown
        if self._draining_task is not None or self._owner._loop is None:
            self.force_exit = self.should_exit = True
            return
        self._owner._loop.call_soon_threadsafe(self.begin_drain)

    def begin_drain(self) -> None:
        if self._draining_task is not None:
            return
        services = self._owner.services
        for service in services:
            service.draining = True
        log.warning("ptexec serve: draining")

        async def idle() -> None:
            for service in services:
                await service.wait_idle()

        async def drain() -> None:
            try:
                await asyncio.wait_for(idle(), self._owner.drain_timeout)
            except asyncio.TimeoutError:
                log.warning("ptexec serve: drain timed out; stopping the generations left")
            await asyncio.sleep(0.05)  # let the last answers' bytes go out
            self.should_exit = True

        self._draining_task = asyncio.ensure_future(drain())
