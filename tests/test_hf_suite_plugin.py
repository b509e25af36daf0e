"""The Hugging Face suite plugin's rules: which failures are "needs the Hub" and which
``optimum-cli`` commands it answers without starting them (no network, no exports)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "hf_suite_plugin.py"
_spec = importlib.util.spec_from_file_location("hf_suite_plugin_under_test", _PATH)
assert _spec is not None and _spec.loader is not None
plugin = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = plugin
_spec.loader.exec_module(plugin)

_OFFLINE = (
    "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
    "them in the cached files."
)


class OfflineModeIsEnabled(ConnectionError):
    """Named as huggingface_hub names its offline error."""


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as e:
        return e


def test_transformers_offline_oserror_is_a_hub_need() -> None:
    reason = plugin.hub_error(OSError(_OFFLINE))
    assert reason is not None and reason.startswith("OSError: We couldn't connect")


def test_hub_error_found_in_the_chain_it_was_raised_from() -> None:
    exc = _raised_from(RuntimeError("export failed"), OfflineModeIsEnabled("Cannot reach"))
    assert plugin.hub_error(exc) == "OfflineModeIsEnabled: Cannot reach"


def test_other_failures_stay_failures() -> None:
    assert plugin.hub_error(AssertionError("logits differ")) is None
    assert plugin.hub_error(ValueError(_OFFLINE)) is None  # only an OSError says it
    # an offline error that was only being handled (not raised from) does not count
    try:
        try:
            raise OSError(_OFFLINE)
        except OSError:
            raise AssertionError("tokens differ") from None
    except AssertionError as e:
        assert plugin.hub_error(e) is None


def test_logged_lookup_failure_then_failure() -> None:
    sections = [
        (
            "Captured log call",
            "WARNING x\n[Errno 2] No such file or directory: "
            "'/c/hub/models--org--name/refs/main'\n",
        ),
    ]
    reason = plugin.logged_hub_error(sections)
    assert reason is not None and "models--org--name/refs/main" in reason
    assert plugin.logged_hub_error([("Captured log call", "WARNING slow kernel\n")]) is None
    assert plugin.logged_hub_error([("other", _OFFLINE)]) is None


def test_cli_model_parsing() -> None:
    assert plugin.cli_model("optimum-cli export executorch --model org/m --task t") == "org/m"
    assert plugin.cli_model(["optimum-cli", "export", "executorch", "-m", "d"]) == "d"
    assert plugin.cli_model("optimum-cli export executorch --model=org/m") == "org/m"
    assert plugin.cli_model("optimum-cli export executorch --help") is None
    assert plugin.cli_model("ls -la") is None
    assert plugin.cli_model(b"optimum-cli") is None


def test_cli_export_of_uncached_repo_is_not_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[object] = []

    def fake_run(*args: object, **kwargs: object) -> str:
        started.append(args[0] if args else kwargs["args"])
        return "ran"

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    guarded = plugin._offline_guard(fake_run)
    with pytest.raises(plugin.HubUnreachable) as info:
        guarded("optimum-cli export executorch --model org/absent --output_dir x", shell=True)
    assert plugin.hub_error(info.value) is not None
    assert started == []
    # a local directory and other commands run
    assert guarded(f"optimum-cli export executorch --model {tmp_path}", shell=True) == "ran"
    assert guarded(args="echo hi") == "ran"
    assert len(started) == 2
    assert subprocess.run is not guarded  # importing the plugin patches nothing
