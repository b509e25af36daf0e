"""Which options of a server what it serves honours: one rule for ``ptexec serve`` and
its Ray Serve deployment (:mod:`ptexec.ray.serve`), so that neither serves without an
option a caller gave."""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["LIMITS", "unhonoured"]

# the options that bound generations and transcriptions (a method call is neither queued
# by them nor stopped part-way)
LIMITS = ("sessions", "max_queue", "timeout")


def unhonoured(
    given: Collection[str], *, llm: bool, speech: bool, methods: bool, join_rows: bool
) -> list[str]:
    """The options of ``given`` that nothing served would honour, in ``given``'s order.

    ``llm``, ``speech`` and ``methods`` say what is served (an LLM, a speech model, the
    program's methods); ``join_rows`` whether the methods' rows are joined. The limits
    (:data:`LIMITS`) are an LLM's or a speech model's; ``join_rows`` the methods',
    ``batch_window_ms`` theirs with ``join_rows``; ``chat_template`` an LLM's;
    ``generation_config`` and ``sampling_rate`` a speech model's.
    """
    honoured = {
        **dict.fromkeys(LIMITS, llm or speech),
        "join_rows": methods,
        "batch_window_ms": methods and join_rows,
        "chat_template": llm,
        "generation_config": speech,
        "sampling_rate": speech,
    }
    unknown = [k for k in given if k not in honoured]
    if unknown:
        raise KeyError(f"no rule for option(s) {', '.join(unknown)}")
    return [k for k in given if not honoured[k]]
