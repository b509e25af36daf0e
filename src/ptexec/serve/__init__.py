"""``ptexec serve``: an OpenAI-compatible HTTP server for exported LLMs (``.pte``).

    from ptexec.serve import Engine, Server

    engine = Engine("llama.pte", "tokenizer.json", sessions=4)
    Server(engine, port=8000).run()          # or .start() on a background thread

Point the ``openai`` client at ``http://127.0.0.1:8000/v1``. One program is loaded once and
served by ``sessions`` runners, each with its own KV cache (:mod:`ptexec.serve.engine`);
speech models (Whisper) answer OpenAI's audio routes (:mod:`ptexec.serve.speech`); the
routes, streaming and errors are in :mod:`ptexec.serve.app`, request fields in
:mod:`ptexec.serve.protocol`, draining in :mod:`ptexec.serve.server`. Needs
``pip install 'ptexec[serve]'`` (Starlette, uvicorn, jinja2, llguidance).
"""

from __future__ import annotations

from .engine import Engine, Job, Result
from .metrics import Metrics
from .programs import ProgramService
from .protocol import ApiError, Request, parse_request
from .server import Server
from .speech import SpeechService

__all__ = [
    "ApiError",
    "Engine",
    "Job",
    "Metrics",
    "ProgramService",
    "Request",
    "Result",
    "Server",
    "SpeechService",
    "parse_request",
]
