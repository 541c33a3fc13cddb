#!/usr/bin/env bash
# The W4 grid (both models, both operating points, 50k and 100k req/s, 1,000,000 requests), each
# cell run RUNS times with up to three implementations interleaved run by run, so that all see
# the same machine (this VM's speed drifts by tens of percent within an hour):
#
#   this build             ./target/release/kafka-timer (build first: cargo build --release)
#   $BASE, if set          another build of the load generator (e.g. an earlier commit's)
#   $NOHINT=1              also this build's `watch` model with --ready-hint false (every check
#                          locks every watcher, as Kafka's checkAndComplete), labelled "nohint"
#   $HARNESS=1             this build's runs also run the harness alone after each run
#                          (`--baseline`): the summary then shows the harness's floor and the
#                          purgatory's share (the run minus the harness)
#   $KAFKA_CMD, if set     a command running Kafka's own DelayedOperationPurgatory and SystemTimer
#                          under the same workload, taking the same --model --num --rate --pct50
#                          --pct75 --timeout --json flags and printing one JSON line with
#                          "cpu_s_per_million": bench-results/kafka-driver/run.sh (build it first
#                          with that directory's build.sh; see its README.md)
#
#   $MODELS                the completion models to run (default "kafka watch")
#
# Prints one JSON line per run, prefixed with the implementation's name and the cell; summarise
# with bench-results/summarize-w4.py. RUNS defaults to 3.
set -euo pipefail
cd "$(dirname "$0")/.."
B=./target/release/kafka-timer
RUNS=${RUNS:-3}
NUM=${NUM:-1000000}
echo "# $(date -u) $(nproc) cpus; $(grep -m1 'model name' /proc/cpuinfo); $(uname -r)"
rustc --version
[ -n "${KAFKA_CMD:-}" ] && echo "# kafka: $KAFKA_CMD"
[ -n "${BASE:-}" ] && echo "# base: $BASE"
echo "## wake-cost"; $B wake-cost
echo "## mem-latency"; $B mem-latency
for model in ${MODELS:-kafka watch}; do
  for point in "20 60 low" "200 400 high"; do
    set -- $point
    for rate in 50000 100000; do
      cell="model=$model point=$3 rate=$rate"
      flags=(--model "$model" --pct50 "$1" --pct75 "$2" --rate "$rate" --num "$NUM")
      for i in $(seq "$RUNS"); do
        echo "rust $cell run=$i $($B "${flags[@]}" ${HARNESS:+--baseline} --progress 0 --json)"
        if [ "$model" = watch ] && [ -n "${NOHINT:-}" ]; then
          echo "nohint $cell run=$i $($B "${flags[@]}" --ready-hint false --progress 0 --json)"
        fi
        if [ -n "${BASE:-}" ]; then
          echo "base $cell run=$i $($BASE "${flags[@]}" --progress 0 --json)"
        fi
        if [ -n "${KAFKA_CMD:-}" ]; then
          echo "kafka $cell run=$i $($KAFKA_CMD "${flags[@]}" --timeout 200 --json 2>/dev/null | tail -1)"
        fi
      done
    done
  done
done
echo "## wake-cost (again)"; $B wake-cost
echo "## mem-latency (again)"; $B mem-latency
echo "# done $(date -u)"
