"""pytest plugin for running Hugging Face's ExecuTorch test files offline, on either runtime.

Loaded with ``-p hf_suite_plugin`` (this directory on ``PYTHONPATH``) by
``scripts/run_hf_suites.py``. It changes no test; it does three things:

* **The runtime.** With ``PTEXEC_AS_EXECUTORCH=1`` it imports ``ptexec`` before any test
  module is collected, so the switch is on when the tests import ExecuTorch's runtime
  modules. The report says which module ``portable_lib`` and ``executorch.runtime``
  resolved to, so a run cannot claim ptexec without having used it.
* **Tests that need the Hub are skipped, and counted.** Nothing may download
  (``HF_HUB_OFFLINE=1``). A test whose failure is the Hub being unreachable (an exception,
  or one it was raised from, that is huggingface_hub's offline/cache-miss error or
  transformers' "couldn't connect to huggingface.co" ``OSError``) is reported as skipped with
  the reason ``needs the Hugging Face Hub: ...``. Only that exception chain is looked at,
  so a test that fails for another reason stays failed.
* **CLI exports of Hub models fail fast.** ``subprocess.run`` of ``optimum-cli export ...
  --model ID`` where ``ID`` is neither a directory nor in the local Hub cache raises the
  same offline error in the test's process instead of starting the CLI, which would fail
  the same way after importing torch and the exporters (minutes on a loaded machine).

``PTEXEC_HF_SUITE_REPORT=path.json`` writes every test's outcome and reason there.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

ENV_REPORT = "PTEXEC_HF_SUITE_REPORT"
HUB_REASON = "needs the Hugging Face Hub"

_OFFLINE_TYPES = frozenset({"OfflineModeIsEnabled", "LocalEntryNotFoundError", "HubUnreachable"})
_OFFLINE_MESSAGES = (
    "couldn't connect to 'https://huggingface.co'",
    "offline mode is enabled",
    "outgoing traffic has been disabled",
    "cannot find an appropriate cached snapshot folder",
)

#: in a failed test's captured output (its log, stderr): a Hub lookup failed offline
_CAPTURED_MARKERS = (
    "couldn't connect to 'https://huggingface.co'",
    "offlinemodeisenabled",
    "cannot reach https://huggingface.co",
)

_outcomes: dict[str, dict[str, str]] = {}
_hub_skipped: set[str] = set()
_cli_short_circuits: list[str] = []


class HubUnreachable(OSError):
    """A command or call needs a Hub repository that is not in the local cache, offline."""


def hub_error(exc: BaseException | None) -> str | None:
    """The offline-Hub error in ``exc`` or the chain it was raised from (``__cause__``),
    as a one-line reason; None when the failure is something else."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if type(exc).__name__ in _OFFLINE_TYPES:
            return f"{type(exc).__name__}: {text}"[:240]
        lowered = str(exc).lower()
        if isinstance(exc, OSError) and any(m in lowered for m in _OFFLINE_MESSAGES):
            return f"{type(exc).__name__}: {text}"[:240]
        exc = exc.__cause__
    return None


def logged_hub_error(sections: list[tuple[str, str]]) -> str | None:
    """The first captured line saying a Hub lookup failed offline (code under test that
    catches the lookup's error, logs it and then fails otherwise), as a reason; else None."""
    for title, text in sections:
        if not title.startswith("Captured"):
            continue
        for line in text.splitlines():
            lowered = line.lower()
            missing_ref = (
                "no such file or directory" in lowered
                and "/refs/" in lowered
                and "models--" in lowered
            )
            if missing_ref or any(m in lowered for m in _CAPTURED_MARKERS):
                return (
                    f"a failed Hub lookup was logged ({line.strip()[:200]}), then the test failed"
                )
    return None


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hub cache holds ``repo_id``'s ``config.json`` at ``main``."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def cli_model(command: Any) -> str | None:
    """The ``--model`` (``-m``) of an ``optimum-cli export`` command line, else None."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError:
            return None
    elif isinstance(command, (list, tuple)):
        argv = [str(a) for a in command]
    else:
        return None
    if len(argv) < 2 or os.path.basename(argv[0]) != "optimum-cli" or argv[1] != "export":
        return None
    for i, arg in enumerate(argv):
        if arg in ("--model", "-m") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def _offline_guard(run: Callable[..., Any]) -> Callable[..., Any]:
    def guarded_run(*args: Any, **kwargs: Any) -> Any:
        command = args[0] if args else kwargs.get("args")
        model = cli_model(command)
        if (
            model is not None
            and os.environ.get("HF_HUB_OFFLINE") == "1"
            and not os.path.isdir(model)
            and not _in_hub_cache(model)
        ):
            _cli_short_circuits.append(model)
            raise HubUnreachable(
                f"optimum-cli export of {model!r}: not a directory and not in the Hub cache "
                "(HF_HUB_OFFLINE=1), the command was not started"
            )
        return run(*args, **kwargs)

    guarded_run.__wrapped__ = run  # type: ignore[attr-defined]
    return guarded_run


def _resolved(name: str) -> str | None:
    module = sys.modules.get(name)
    return None if module is None else module.__name__


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PTEXEC_AS_EXECUTORCH", "").strip().lower() in ("1", "true", "yes", "on"):
        import ptexec  # noqa: F401  (reading the variable turns the switch on)
        from ptexec.hf import switch

        if not switch.is_active():
            raise pytest.UsageError("PTEXEC_AS_EXECUTORCH=1 but ptexec's switch is not on")
    subprocess.run = _offline_guard(subprocess.run)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        reason = hub_error(call.excinfo.value)
        if reason is None:
            reason = logged_hub_error(report.sections)
        if reason is not None:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"{HUB_REASON}: {reason}")
            _hub_skipped.add(item.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        reason = _last_line(report.longreprtext)
        _outcomes[report.nodeid] = {"outcome": "error", "reason": f"not collected: {reason}"}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "reason": ""})
    if report.when == "call" or report.failed or report.skipped:
        if report.failed:
            state = "failed" if report.when == "call" else "error"
        elif report.skipped:
            state = "skipped"
        else:
            state = "passed"
        if entry["outcome"] in ("failed", "error") and report.when == "teardown":
            return
        entry["outcome"] = state
        if report.skipped and isinstance(report.longrepr, tuple):
            entry["reason"] = str(report.longrepr[2])
        elif report.failed:
            entry["reason"] = _last_line(report.longreprtext)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("E ")]
    if lines:
        return lines[-1][2:].strip()[:300]
    rest = text.strip().splitlines()
    return rest[-1][:300] if rest else ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(ENV_REPORT)
    if not path:
        return
    from ptexec.hf import switch

    data = {
        "switch_on": switch.is_active(),
        "portable_lib": _resolved("executorch.extension.pybindings.portable_lib"),
        "runtime": _resolved("executorch.runtime"),
        "exit_status": int(exitstatus),
        "hub_skipped": sorted(_hub_skipped),
        "cli_short_circuits": len(_cli_short_circuits),
        "tests": _outcomes,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
