#!/usr/bin/env python
"""Fuzz ptexec's loader on the Vulkan-delegated fixtures, in this process.

The seeds and their field maps are tests/test_fuzz_vulkan.py's (the loader fuzzer's
program fields plus every field of each ``VkGraph`` payload); each case is drawn and run by
scripts/fuzz_loader.py (``draw_case``, ``guarded``). Prints the outcome counts and every
finding (an exception other than a ptexec error escaping, an output that contradicts its
declaration, an allocation past the cap); cases slower than ``--slow`` seconds are listed.

    python scripts/fuzz_vulkan.py --cases 100000 [--seed 0] [--start 0] [--json summary.json]

Case ``i`` is drawn from ``(seed, i)`` alone, so runs over disjoint ``--start``/``--cases``
ranges of one seed (in parallel, or one after another) add up to one longer run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import test_fuzz_vulkan as tv  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="the first case's index")
    ap.add_argument("--slow", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    fl, seeds = tv.fl, tv.SEEDS
    counts: Counter[str] = Counter()
    findings: list[dict] = []
    slow: list[dict] = []
    start = time.perf_counter()
    for n, i in enumerate(range(args.start, args.start + args.cases)):
        case = fl.draw_case(seeds, fl.case_rng(args.seed, i))
        pte, ptd = case.files(seeds)
        outcome = fl.guarded(pte, ptd, seeds[case.seed].inputs, tv.METER)
        counts[outcome.status] += 1
        if outcome.is_finding:
            findings.append(
                {
                    "index": i,
                    **case.to_json(),
                    "outcome": outcome.status,
                    "stage": outcome.stage,
                    "detail": outcome.detail,
                }
            )
            print(f"FINDING {i}: {outcome.status} at {outcome.stage}: {outcome.detail}", flush=True)
        if outcome.seconds > args.slow:
            slow.append({"index": i, "seed": case.seed, "seconds": outcome.seconds})
        if (n + 1) % 1000 == 0 or n + 1 == args.cases:
            elapsed = time.perf_counter() - start
            print(f"{n + 1} cases, {elapsed:.0f} s: {dict(counts)}", flush=True)
            if args.json:
                summary = {
                    "seed": args.seed,
                    "start": args.start,
                    "cases": n + 1,
                    "seconds": elapsed,
                    "counts": dict(counts),
                    "findings": findings,
                    "slow": slow,
                }
                args.json.write_text(json.dumps(summary, indent=1))
    print(f"findings: {len(findings)}; slow cases: {len(slow)}")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
