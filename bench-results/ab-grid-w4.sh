#!/usr/bin/env bash
# The W4 grid (both models, both operating points, 50,000 and 100,000 req/s), two builds run by
# run interleaved (A, B, A, B, ...), so both see the machine's same moments: one line per run
# (total, generator and completer CPU s per million, the checks, wake-up cost), then the medians.
#
#   bench-results/ab-grid-w4.sh BIN_A BIN_B RUNS [extra W4 flags...]
set -euo pipefail
a=$1 b=$2 runs=$3
shift 3
extra=("$@")
echo "# $(date -u +%FT%TZ) nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -r)"
echo "# A: $a   B: $b   runs: $runs   extra flags: $*"
row() {
  "$1" "${@:3}" --json --progress 0 | python3 -c '
import json, sys
r = json.load(sys.stdin)
t = {k: v["cpu_s_per_million"] for k, v in r["threads"].items()}
print(sys.argv[1], r["cpu_s_per_million"], t["generator"], t["completer"], r["sustained"],
      r["exactly_once"], r["expired_ok"], round(r["wake_cost_us"], 1), r["peak_rss_bytes"] >> 20,
      round(r["bytes_per_pending"]))' "$2"
}
for cell in "kafka 20 60 50000" "kafka 20 60 100000" "kafka 200 400 50000" "kafka 200 400 100000" \
            "watch 20 60 50000" "watch 20 60 100000" "watch 200 400 50000" "watch 200 400 100000"; do
  read -r model p50 p75 rate <<<"$cell"
  flags=(--model "$model" --pct50 "$p50" --pct75 "$p75" --rate "$rate" "${extra[@]}")
  echo "## $model $p50/$p75 ms $rate/s   (build cpu_s/M generator completer sustained exactly_once expired_ok wake_us rss_MB B/pending)"
  for i in $(seq "$runs"); do
    row "$a" A "${flags[@]}"
    row "$b" B "${flags[@]}"
  done
done
