#!/usr/bin/env python
"""Run ExecuTorch's backend operator test suite through its ``vulkan`` flows on ptexec.

Every case is lowered with the flow's exporter and run with ptexec on the CPU, compared
with eager PyTorch (tests/vulkan_suite.py). Prints one line per case that is not a
match, then the counts, and writes every result as JSON (``--json``).

    python scripts/vulkan_suite.py [--flow vulkan] [--select add] [--json out.json]
        [--seed 0] [--resume]

``--report A.json [B.json ...]`` runs nothing: it prints the Markdown tables of
docs/vulkan_coverage.md from result files (per flow, then per test module).

``--resume`` keeps the results already in ``--json`` and runs only the cases missing there;
``--seed`` shuffles each test module's cases (the modules stay round-robin), so that a run
cut short is a seeded random sample covering every module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from vulkan_suite import FLOWS, Result, case_of, lowered, run_all, summary  # noqa: E402


def report(files: list[Path]) -> str:
    """Markdown tables of the results in ``files``: per flow, then per test module."""
    results = [Result(**x) for f in files for x in json.loads(f.read_text())]
    flows = sorted({r.flow for r in results}, key=lambda f: (len(f), f))
    lines = [
        "| flow | suite cases run | programs | export error | not lowered | skipped "
        "| Vulkan-lowered | of them, delegates with no op | match | mismatch | ptexec error "
        "| match % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for flow in flows:
        fr = [r for r in results if r.flow == flow]
        c = summary(fr)
        low = lowered(fr)
        ok = c.get("match", 0)
        pct = f"{100 * ok / len(low):.1f}" if low else "-"
        lines.append(
            f"| `{flow}` | {len({case_of(r) for r in fr})} | {len(fr)} "
            f"| {c.get('export_error', 0)} | {c.get('not_lowered', 0)} | {c.get('skipped', 0)} "
            f"| {len(low)} | {sum(not r.ops for r in low)} | {ok} | {c.get('mismatch', 0)} "
            f"| {c.get('ptexec_error', 0)} | {pct} |"
        )
    lines += [
        "",
        "| test module | "
        + " | ".join(f"`{f}`: lowered / match (not lowered, export error)" for f in flows)
        + " |",
        "|---" * (1 + len(flows)) + "|",
    ]
    modules = sorted({case_of(r).split("::")[0] for r in results})
    for module in modules:
        cells = []
        for flow in flows:
            mr = [r for r in results if r.flow == flow and case_of(r).split("::")[0] == module]
            c = summary(mr)
            cells.append(
                f"{len(lowered(mr))} / {c.get('match', 0)} "
                f"({c.get('not_lowered', 0)}, {c.get('export_error', 0)})"
                if mr
                else "-"
            )
        lines.append(f"| `{module.removeprefix('test_')}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, nargs="+", help="print tables from result files")
    ap.add_argument("--flow", action="append", choices=FLOWS, help="default: both")
    ap.add_argument("--select", help="only test modules whose name contains this")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seed", type=int, help="shuffle each module's cases with this seed")
    ap.add_argument("--resume", action="store_true", help="skip the cases --json has")
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    flows = tuple(args.flow or FLOWS)
    results: list[Result] = []
    if args.resume and args.json and args.json.exists():
        results = [Result(**x) for x in json.loads(args.json.read_text())]
        if results:  # the last case may have been cut short: run it again
            last = (case_of(results[-1]), results[-1].flow)
            results = [r for r in results if (case_of(r), r.flow) != last]
    done = frozenset((case_of(r), r.flow) for r in results)
    start = time.perf_counter()
    for r in run_all(flows, args.select, args.device, args.seed, done):
        results.append(r)
        if r.status != "match":
            print(f"{r.status:13} {r.flow:32} {r.case}  {r.detail}", flush=True)
        if args.json:
            args.json.write_text(json.dumps([dataclasses.asdict(x) for x in results], indent=1))
    counts = summary(results)
    low = lowered(results)
    matched = sum(r.status == "match" for r in low)
    print(f"{len(results)} cases in {time.perf_counter() - start:.0f} s: {counts}")
    for flow in flows:
        fl = [r for r in low if r.flow == flow]
        ok = sum(r.status == "match" for r in fl)
        print(f"  {flow}: {ok}/{len(fl)} Vulkan-lowered cases match eager")
    print(
        f"lowered: {matched}/{len(low)} match"
        + (f" ({100 * matched / len(low):.1f}%)" if low else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
