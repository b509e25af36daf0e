"""Run Hugging Face's own ExecuTorch tests on ExecuTorch's runtime and on ptexec; count.

No copy of their tests is kept here: give a directory holding their test files (a checkout
of the repository at the tag of the installed version, or an extract of its ``tests/``)::

    python scripts/run_hf_suites.py --optimum CHECKOUT [--optimum-python PY] \\
        [--transformers CHECKOUT --transformers-python PY] [--out DIR]

Each suite runs twice with pytest in its own environment's interpreter: once as it is
(ExecuTorch's runtime) and once with ``PTEXEC_AS_EXECUTORCH=1`` (ptexec's switch). Both
runs are offline (``HF_HUB_OFFLINE=1``, ``RUN_SLOW=1`` so the tests marked slow are tried
rather than skipped for being slow) with ``hf_suite_plugin`` (beside this file), which
skips and counts the tests that need the Hub. Prints passed/failed/skipped for both runtimes
and every test whose outcome differs, and writes ``DIR/<suite>-<runtime>.json``.

Suites:

* ``optimum``: optimum-executorch's ``tests/models/test_modeling_*.py`` (every file there
  is about ExecuTorch);
* ``transformers``: transformers' ``tests/test_executorch.py`` and the ExecuTorch files of
  its ``tests/exporters/`` (``test_executorch*.py`` but MLX's, which needs Apple's backend),
  those present, and any other file named with ``--transformers-files``. A PyPI sdist of
  transformers (``pip download --no-deps --no-binary :all: transformers==VERSION``) holds
  only the top-level tests: unpacked, it is a directory this takes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
RUNTIMES = ("executorch", "ptexec")

#: Hub repositories the tests name that ``--tiny-hub-models`` stands in for, with the tiny
#: random model put in a private Hub cache under that name (made with ``from_config``;
#: the weights are random, not the Hub's, so only tests that check structure can pass).
TINY_STAND_INS = {
    "optimum-internal-testing/tiny-random-llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=256,
        ),
    ),
    # transformers' tests/test_executorch.py (its torch.export wrappers against eager)
    "hf-internal-testing/tiny-random-LlamaForCausalLM": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=256,
        ),
    ),
}

_MAKE_STAND_INS = """
import json, sys, pathlib, torch, transformers
cache, spec = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2])
for repo, (config_cls, model_cls, kwargs) in spec.items():
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**kwargs)
    model = getattr(transformers, model_cls)(config).eval()
    folder = cache / ("models--" + repo.replace("/", "--"))
    revision = "0" * 40
    model.save_pretrained(folder / "snapshots" / revision)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
"""


def make_tiny_hub_cache(python: str, cache: Path) -> None:
    """A Hub cache holding :data:`TINY_STAND_INS`, made by ``python``'s transformers."""
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [python, "-c", _MAKE_STAND_INS, str(cache), json.dumps(TINY_STAND_INS)], check=True
    )


def optimum_files(root: Path) -> list[str]:
    """optimum-executorch's model test files, relative to ``root``."""
    files = sorted((root / "tests" / "models").glob("test_modeling_*.py"))
    if not files:
        raise SystemExit(f"no tests/models/test_modeling_*.py under {root}")
    return [str(f.relative_to(root)) for f in files]


def transformers_files(root: Path, extra: list[str]) -> list[str]:
    """transformers' ExecuTorch test files, relative to ``root``: the top-level
    ``tests/test_executorch.py`` (the only one a PyPI sdist of transformers carries) and
    ``tests/exporters/test_executorch*.py`` but MLX's (a repository checkout)."""
    found = [root / "tests" / "test_executorch.py"]
    found += [
        f
        for f in sorted((root / "tests" / "exporters").glob("test_executorch*.py"))
        if "mlx" not in f.name
    ]
    files = [str(f.relative_to(root)) for f in found if f.is_file()]
    files += [f for f in extra if f not in files]
    if not files:
        raise SystemExit(
            f"no tests/test_executorch.py or tests/exporters/test_executorch*.py under {root}"
        )
    return files


def run_suite(
    name: str,
    python: str,
    root: Path,
    files: list[str],
    runtime: str,
    out: Path,
    timeout: int,
    hub_cache: Path | None = None,
) -> dict[str, Any]:
    """One pytest run of ``files`` under ``root`` on ``runtime``; the plugin's report."""
    report = out / f"{name}-{runtime}.json"
    report.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        RUN_SLOW="1",
        TOKENIZERS_PARALLELISM="false",
        PTEXEC_AS_EXECUTORCH="1" if runtime == "ptexec" else "0",
        PTEXEC_HF_SUITE_REPORT=str(report),
        # the environment's scripts (optimum-cli) on PATH, as an activated environment has them
        PATH=os.pathsep.join((str(Path(python).parent), env.get("PATH", ""))),
        PYTHONPATH=os.pathsep.join(
            p for p in (str(HERE), str(SRC), env.get("PYTHONPATH", "")) if p
        ),
    )
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = str(hub_cache)
    command = [python, "-m", "pytest", "-p", "hf_suite_plugin", "-p", "no:cacheprovider"]
    command += ["--continue-on-collection-errors"]
    command += ["-q", "-rfEs", "--rootdir", str(root), *files]
    log = out / f"{name}-{runtime}.log"
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        try:
            rc = subprocess.run(
                command, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    seconds = time.monotonic() - start
    if not report.exists():
        raise SystemExit(f"{name} on {runtime}: pytest wrote no report (rc {rc}); see {log}")
    data: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
    data["seconds"] = round(seconds, 1)
    data["timed_out"] = rc == -1
    expect = "ptexec.portable_lib" if runtime == "ptexec" else None
    resolved = data.get("portable_lib")
    if runtime == "ptexec" and resolved not in (expect, None):
        raise SystemExit(f"{name} on ptexec: portable_lib resolved to {resolved}, not ptexec's")
    if runtime == "executorch" and resolved is not None and resolved.startswith("ptexec"):
        raise SystemExit(f"{name} on ExecuTorch: portable_lib resolved to {resolved}")
    report.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    return data


def counts(data: dict[str, Any]) -> Counter[str]:
    tally = Counter(entry["outcome"] for entry in data["tests"].values())
    tally["hub"] = len(data["hub_skipped"])
    return tally


def summarize(name: str, results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{name}:"]
    lines.append(
        f"  {'runtime':<11} {'passed':>6} {'failed':>6} {'error':>5} {'skipped':>7} {'(Hub)':>5}  seconds"
    )
    for runtime in RUNTIMES:
        c = counts(results[runtime])
        lines.append(
            f"  {runtime:<11} {c['passed']:>6} {c['failed']:>6} {c['error']:>5} {c['skipped']:>7}"
            f" {c['hub']:>5}  {results[runtime]['seconds']:.0f}"
            + ("  (timed out)" if results[runtime]["timed_out"] else "")
        )
    base, other = (results[r]["tests"] for r in RUNTIMES)
    differ = sorted(
        k
        for k in set(base) | set(other)
        if base.get(k, {}).get("outcome") != other.get(k, {}).get("outcome")
    )
    lines.append(f"  tests whose outcome differs: {len(differ)}")
    for nodeid in differ:
        a, b = base.get(nodeid, {}), other.get(nodeid, {})
        lines.append(
            f"    {nodeid}: executorch {a.get('outcome', '-')}, ptexec {b.get('outcome', '-')}"
        )
        for runtime, entry in (("executorch", a), ("ptexec", b)):
            if entry.get("reason") and entry.get("outcome") != "passed":
                lines.append(f"      {runtime}: {entry['reason']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--optimum", type=Path, help="optimum-executorch checkout (holds tests/models)"
    )
    parser.add_argument(
        "--optimum-python", default=sys.executable, help="interpreter of its environment"
    )
    parser.add_argument(
        "--transformers", type=Path, help="transformers checkout (holds tests/exporters)"
    )
    parser.add_argument("--transformers-python", default=sys.executable)
    parser.add_argument(
        "--transformers-files", nargs="*", default=[], help="more files, relative to the checkout"
    )
    parser.add_argument(
        "--only", nargs="*", default=[], help="run only these files (relative paths)"
    )
    parser.add_argument("--out", type=Path, default=Path("hf-suites"), help="where the reports go")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per pytest run")
    parser.add_argument(
        "--tiny-hub-models",
        action="store_true",
        help="a private Hub cache with tiny random stand-ins for the tiny test repositories "
        "the tests name (TINY_STAND_INS), instead of the user's cache",
    )
    args = parser.parse_args(argv)
    if args.optimum is None and args.transformers is None:
        parser.error("give --optimum and/or --transformers")
    args.out.mkdir(parents=True, exist_ok=True)
    suites = []
    if args.optimum is not None:
        suites.append(
            ("optimum", args.optimum_python, args.optimum.resolve(), optimum_files(args.optimum))
        )
    if args.transformers is not None:
        root = args.transformers.resolve()
        suites.append(
            (
                "transformers",
                args.transformers_python,
                root,
                transformers_files(root, args.transformers_files),
            )
        )
    summaries = []
    for name, python, root, files in suites:
        if args.only:
            files = [f for f in files if f in args.only]
        hub_cache = None
        if args.tiny_hub_models:
            hub_cache = args.out / f"hub-cache-{name}"
            make_tiny_hub_cache(python, hub_cache)
        results = {
            rt: run_suite(name, python, root, files, rt, args.out, args.timeout, hub_cache)
            for rt in RUNTIMES
        }
        summaries.append(summarize(name, results))
        print(summaries[-1], flush=True)
    (args.out / "summary.txt").write_text("\n\n".join(summaries) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
