#!/usr/bin/env bash
# A/B of W4 between two builds of the load generator, runs interleaved (A, B, A, B, ...) so that
# both see the same machine: prints each run's CPU s per million and the medians.
#
#   bench-results/ab-w4.sh BIN_A BIN_B RUNS [W4 flags...]
#   e.g. bench-results/ab-w4.sh /tmp/base/kafka-timer target/release/kafka-timer 5 --rate 50000
#
# Like for like against Kafka's own purgatory: B = bench-results/kafka-driver/run.sh (built by
# that directory's build.sh; it takes the same flags and has no "sustained" field: "-").
#
# The flags go to both binaries, so use only flags both know.
set -euo pipefail
a=$1 b=$2 runs=$3
shift 3
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
cpu() { "$1" "${@:2}" --json --progress 0 | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["cpu_s_per_million"], r.get("sustained", "-"), r["exactly_once"])'; }
# Each run's figures in files of its own (two A/Bs at once must not mix their runs).
fa=$(mktemp) fb=$(mktemp)
trap 'rm -f "$fa" "$fb"' EXIT
for i in $(seq "$runs"); do
  ra=$(cpu "$a" "$@"); rb=$(cpu "$b" "$@")
  echo "run $i: A $ra | B $rb"
  echo "$ra" | cut -d' ' -f1 >>"$fa"
  echo "$rb" | cut -d' ' -f1 >>"$fb"
done
ma=$(median <"$fa") mb=$(median <"$fb")
echo "median CPU s/M: A $ma  B $mb  (B/A $(python3 -c "print(round($mb/$ma, 3))"))"
