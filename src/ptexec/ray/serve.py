"""``ptexec serve`` as a Ray Serve deployment: the same application, on replicas.

Each replica is the server's application (:func:`ptexec.serve.app.create_app`) over its
own :class:`~ptexec.serve.Engine` (a program loaded once per replica, ``sessions`` sessions)
and, with ``programs=True``, its :class:`~ptexec.serve.ProgramService`. Ray Serve does the
rest: the HTTP proxy, replicas, autoscaling, ``num_gpus`` per replica (a replica given a
GPU places the program on it). Program methods are micro-batched inside each replica by the
``ptexec.ray`` batching rules (the service's window), which is what ``@serve.batch`` would
do, without a second copy of the rules.

From Python::

    from ray import serve
    import ptexec.ray.serve as pserve

    app = pserve.deployment(num_replicas=2).bind("llama.pte", "tokenizer.json", sessions=2)
    serve.run(app, route_prefix="/")

or from a config file (``serve run config.yaml``), with :func:`build_app` as the import
path and the constructor's keywords as ``args``::

    applications:
      - name: llm
        route_prefix: /
        import_path: ptexec.ray.serve:build_app
        args: {model: /models/llama.pte, tokenizer: /models/tokenizer.json, sessions: 2}
        deployments:
          - name: PtexecServer
            num_replicas: 2          # or autoscaling_config: {min_replicas: 1, max_replicas: 4}
            ray_actor_options: {num_cpus: 1, num_gpus: 0}

Importing this module does not import Ray; :func:`deployment` and :func:`build_app` do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["build_app", "check_options", "deployment"]

_CLASS: Any = None


class _Replica:
    """One replica: the engine, the program methods and the application over them."""

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        *,
        sessions: int | None = None,
        max_queue: int | None = None,
        timeout: float | None = None,
        model_name: str | None = None,
        chat_template: str | None = None,
        data_path: str | None = None,
        programs: bool = False,
        join_rows: bool = False,
        batch_window_ms: float | None = None,
        api_key: str | None = None,
        max_body_bytes: int = 1 << 20,
        threads: int | None = None,
        compile: bool = False,
    ) -> None:
        import ptexec
        from ptexec.llm.decoder import load_options
        from ptexec.serve import Engine, ProgramService

        check_options(tokenizer, {
            "sessions": sessions, "max_queue": max_queue, "timeout": timeout,
            "chat_template": chat_template, "programs": programs, "join_rows": join_rows,
            "batch_window_ms": batch_window_ms,
        })  # fmt: skip

        if threads is not None:  # torch's threads and ExecuTorch's XNNPACK pool
            ptexec.set_num_threads(threads)
        from ptexec.ray.mapper import assigned_device

        gpu = assigned_device()  # the GPU Ray gave this replica, or None: the CPU
        device_map = str(gpu) if gpu is not None else None
        # as ptexec serve --compile: answer at once, interpreted, and switch to compiled code
        # once a compile in another process is done (the engine's and the methods' alike)
        compile_mode = "background" if compile else False
        self.engine = None
        if tokenizer is not None:
            self.engine = Engine(
                model, tokenizer, data_path=data_path, model_name=model_name,
                sessions=1 if sessions is None else sessions,
                max_queue=16 if max_queue is None else max_queue, timeout=timeout,
                device_map=device_map, compile=compile_mode, chat_template=chat_template,
            )  # fmt: skip
        self.programs = None
        if programs or self.engine is None:
            program = (
                self.engine.program
                if self.engine is not None
                else ptexec.load(model, data_path=data_path)
            )
            options = load_options(device_map, compile_mode)
            self.programs = ProgramService(
                program,
                join=join_rows,
                window=(2.0 if batch_window_ms is None else batch_window_ms) / 1e3,
                **options,
            )
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    def __serve_build_asgi_app__(self) -> Any:
        from ptexec.serve.app import create_app

        return create_app(
            self.engine,
            programs=self.programs,
            api_key=self.api_key,
            max_body_bytes=self.max_body_bytes,
        )


def check_options(tokenizer: str | None, keywords: Mapping[str, Any]) -> None:
    """Raise :class:`~ptexec.errors.ConfigValueError` for an option that nothing a replica
    serves would honour (``ptexec serve`` refuses the same); ``keywords`` are a replica's,
    an option None or absent where not given. Without a tokenizer a replica serves the
    methods alone, so the limits (``sessions``, ``max_queue``, ``timeout``) and
    ``chat_template`` have nothing to bound or template; ``join_rows`` needs the methods
    served (``programs=True`` beside an LLM), and ``batch_window_ms`` needs ``join_rows``."""
    from ptexec.errors import ConfigValueError
    from ptexec.serve.options import LIMITS, unhonoured

    ruled = (*LIMITS, "chat_template", "batch_window_ms")
    join_rows = bool(keywords.get("join_rows", False))
    given = ["join_rows"] if join_rows else []  # first: the window is only its option
    given += [k for k in ruled if keywords.get(k) is not None]
    llm = tokenizer is not None
    methods = bool(keywords.get("programs", False)) or not llm
    unused = unhonoured(given, llm=llm, speech=False, methods=methods, join_rows=join_rows)
    if unused:
        served = "an LLM" if not methods else "the program's methods" if not llm else "both"
        raise ConfigValueError(
            unused[0],
            f"nothing this deployment serves ({served}) would honour {', '.join(unused)}: "
            "the limits and chat_template are an LLM's (give a tokenizer), join_rows the "
            "methods' (programs=True beside an LLM), batch_window_ms theirs with join_rows",
        )


def _deployment_class() -> Any:
    global _CLASS
    if _CLASS is None:
        from ray import serve

        class PtexecServer(_Replica):
            pass

        _CLASS = serve.deployment(serve.ingress()(PtexecServer), name="PtexecServer")
    return _CLASS


def deployment(**options: Any) -> Any:
    """The Ray Serve deployment (``options``: ``num_replicas``, ``autoscaling_config``,
    ``ray_actor_options={"num_gpus": 1}``, ``max_ongoing_requests``, ...); ``.bind(model,
    tokenizer, **keywords)`` takes the arguments of a replica (see the module docstring)."""
    cls = _deployment_class()
    return cls.options(**options) if options else cls


def build_app(args: dict[str, Any]) -> Any:
    """The application for ``serve run`` / a config file: ``args`` are a replica's
    keywords (``model`` required)."""
    keywords = dict(args)
    model = keywords.pop("model")
    tokenizer = keywords.pop("tokenizer", None)
    check_options(tokenizer, keywords)  # before any replica starts (each checks again)
    return deployment().bind(model, tokenizer, **keywords)
