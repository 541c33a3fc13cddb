#!/usr/bin/env python3
"""Summarises the output of campaign-w4-peers.sh: per cell and implementation, the median CPU
seconds per million requests (and the runs; "nohint" is this build's `watch` model with
`--ready-hint false`; "harness" the harness alone after each run and "purgatory" the run minus
it, with HARNESS=1), whether every run was sustained (ours: the report's
own verdict; Kafka's: achieved within 2% and expired within 0.1% of expected plus a tick's
worth), and the ratios of the medians against ours.

    python3 bench-results/summarize-w4.py < bench-results/2026-11-23-peers.txt
"""
import json
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)  # (cell, impl) -> [report]
order = []
for line in sys.stdin:
    parts = line.split(" ", 5)
    if len(parts) < 6 or parts[0] not in ("rust", "nohint", "base", "kafka"):
        continue
    impl, cell = parts[0], " ".join(parts[1:4])
    try:
        report = json.loads(parts[5])
    except json.JSONDecodeError:
        continue
    if cell not in order:
        order.append(cell)
    runs[(cell, impl)].append(report)
    if impl == "rust" and "baseline" in report:
        # --baseline (HARNESS=1): the harness alone, and the run minus it (the purgatory's share).
        runs[(cell, "harness")].append(report["baseline"])
        runs[(cell, "purgatory")].append(
            {"cpu_s_per_million": report["purgatory_cpu_s_per_million"],
             "sustained": report["sustained"] and report["baseline"]["sustained"]})


def sustained(impl, r):
    if impl in ("rust", "nohint", "base", "harness", "purgatory"):
        return bool(r.get("sustained"))
    ok_rate = r["achieved_rate"] >= 0.98 * r["target_rate"]
    ok_expired = abs(r["expired"] - r["expected_expired"]) <= 0.001 * r["num"] + 0.01 * r["expected_expired"]
    return ok_rate and ok_expired and r.get("not_exactly_once", 0) == 0


IMPLS = ("rust", "harness", "purgatory", "nohint", "base", "kafka")
print("| cell | impl | CPU s/M median (runs) | all sustained | ratio to rust |")
print("|---|---|---|---|---|")
for cell in order:
    med = {}
    for impl in IMPLS:
        rs = runs.get((cell, impl))
        if rs:
            med[impl] = statistics.median(r["cpu_s_per_million"] for r in rs)
    for impl in IMPLS:
        rs = runs.get((cell, impl))
        if not rs:
            continue
        vals = ", ".join(f"{r['cpu_s_per_million']:.2f}" for r in rs)
        ok = all(sustained(impl, r) for r in rs)
        ratio = med[impl] / med["rust"] if "rust" in med and med["rust"] > 0 else float("nan")
        print(f"| {cell} | {impl} | {med[impl]:.2f} ({vals}) | {'yes' if ok else 'NO'} | {ratio:.2f} |")
