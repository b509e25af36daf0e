#!/usr/bin/env python3
"""Replay the fixtures with ExecuTorch's own runtime and compare with eager PyTorch.

Usage:
    python scripts/check_fixtures.py [--dir tests/fixtures] [--only NAME ...]
                                     [--update-manifest] [--inventory]

For every fixture the program is loaded once with
``executorch.runtime.Runtime.get().load_program(pte, data_path=ptd)`` and its calls are
replayed in order. The verdict is "ok" or "diverges: <why>"; with --update-manifest it is
written to the manifest entry as "executorch_runtime", so the test suite knows what the
reference runtime does. A fixture whose manifest entry names a known divergence (an
ExecuTorch bug or limitation) records that reason together with what was observed.

--inventory prints, per fixture, the operators ('name.overload'), instruction kinds and
EValue kinds in the program, then the union over all fixtures.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tests"))

from fixture_data import compare_outputs  # noqa: E402


def _brief(values: list[Any]) -> list[Any]:
    return [v.flatten()[:4].tolist() if isinstance(v, torch.Tensor) else v for v in values]


def replay(
    pte: Path, ptd: Path | None, calls: list[dict[str, Any]], tol: tuple[float, float]
) -> tuple[str | None, list[str]]:
    """Replay `calls` on one program loaded by ExecuTorch's runtime.

    Returns (the first problem or None, one line per call saying what the runtime gave).
    Calls after a mismatch still run, so a divergence's whole course is recorded.
    """
    from executorch.runtime import Runtime

    try:
        program = Runtime.get().load_program(pte, data_path=ptd)
    except Exception as exc:
        return f"load_program failed: {type(exc).__name__}: {exc}", []
    first: str | None = None
    observed: list[str] = []
    for i, call in enumerate(calls):
        try:
            method = program.load_method(call["method"])
        except Exception as exc:
            problem = f"load_method({call['method']!r}) failed: {type(exc).__name__}: {exc}"
            return first or problem, observed
        try:
            outputs = list(method.execute(copy.deepcopy(call["inputs"])))
        except Exception as exc:
            problem = f"call {i} ({call['method']}) failed: {type(exc).__name__}: {exc}"
            return first or problem, observed
        problem = compare_outputs(outputs, call["outputs"], *tol)
        if problem is None:
            observed.append(f"{call['method']} ok")
        else:
            observed.append(
                f"{call['method']} -> {_brief(outputs)} (eager {_brief(call['outputs'])})"
            )
            if first is None:
                first = f"call {i} ({call['method']}): {problem}"
    return first, observed


OBSERVED_MARK = " ExecuTorch 1.5.1 executorch.runtime, call by call: "


def check(
    directory: Path, names: list[str] | None = None, update_manifest: bool = False
) -> dict[str, str]:
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    verdicts: dict[str, str] = {}
    for name in names or list(manifest):
        entry = manifest[name]
        pte = directory / entry["pte"]
        ptd = directory / entry["ptd"] if entry.get("ptd") else None
        calls = torch.load(directory / f"{name}.io.pt", weights_only=True)["calls"]
        problem, observed = replay(pte, ptd, calls, (entry["rtol"], entry["atol"]))
        known = entry.get("known_divergence")
        description = entry["description"].split(OBSERVED_MARK)[0]
        if problem is None:
            verdict = "ok"
            if known:
                print(f"[check] WARNING {name}: known divergence did not reproduce ({known})")
        elif known:
            verdict = f"diverges: {known}. Observed: {problem}"
            if observed:
                description += OBSERVED_MARK + "; ".join(observed) + "."
        else:
            verdict = f"diverges: unexpected: {problem}"
            print(f"[check] WARNING {name}: unexpected divergence")
        verdicts[name] = verdict
        print(f"[check] {name}: {verdict}", flush=True)
        entry["executorch_runtime"] = verdict
        entry["description"] = description
    if update_manifest:
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    ok = sum(v == "ok" for v in verdicts.values())
    print(f"[check] {ok}/{len(verdicts)} match eager with executorch.runtime")
    return verdicts


def inventory(directory: Path, names: list[str] | None = None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_fixtures import raw_program

    manifest = json.loads((directory / "manifest.json").read_text())
    all_ops: Counter[str] = Counter()
    all_instr: Counter[str] = Counter()
    all_values: Counter[str] = Counter()
    for name in names or list(manifest):
        prog = raw_program((directory / manifest[name]["pte"]).read_bytes())
        ops, instr, values = set(), Counter(), Counter()
        for plan in prog.execution_plan:
            for op in plan.operators:
                ops.add(f"{op.name}.{op.overload}" if op.overload else op.name)
            for chain in plan.chains:
                instr.update(type(i.instr_args).__name__ for i in chain.instructions)
            values.update(type(v.val).__name__ for v in plan.values)
        print(f"{name}:")
        print(f"  operators: {', '.join(sorted(ops))}")
        print(f"  instructions: {dict(sorted(instr.items()))}")
        print(f"  evalues: {dict(sorted(values.items()))}")
        all_ops.update(ops)
        all_instr.update(instr)
        all_values.update(values)
    print("ALL operators (fixtures using each):")
    for op, n in sorted(all_ops.items()):
        print(f"  {op}: {n}")
    print(f"ALL instructions: {dict(sorted(all_instr.items()))}")
    print(f"ALL evalues: {dict(sorted(all_values.items()))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--only", nargs="+", metavar="NAME")
    parser.add_argument("--update-manifest", action="store_true")
    parser.add_argument("--inventory", action="store_true")
    args = parser.parse_args(argv)
    if args.inventory:
        inventory(args.dir, args.only)
        return 0
    verdicts = check(args.dir, args.only, args.update_manifest)
    return 1 if any("unexpected" in v for v in verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
