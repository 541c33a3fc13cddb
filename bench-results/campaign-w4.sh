#!/bin/bash
# The W4 part of the campaign (bench-results/campaign.sh runs every workload): the wake-up cost,
# the W4 grid (both models, both operating points, 50k and 100k req/s, 3 runs each), both
# --find-max-rate searches and the purgatory's criterion bench. Raw output on stdout
# (bench-results/2026-11-22-session3.txt is its output). Build first: cargo build --release &&
# cargo bench --bench purgatory --no-run. Takes about 12 minutes on 2 cores.
cd "$(dirname "$0")/.."
B=./target/release/kafka-timer
echo "# $(date -u) $(nproc) cpus; $(grep -m1 'model name' /proc/cpuinfo)"; rustc --version
echo "## wake-cost"; $B wake-cost
echo "## mem-latency"; $B mem-latency
for model in kafka watch; do
  for point in "20 60 low" "200 400 high"; do
    set -- $point
    for rate in 50000 100000; do
      for i in 1 2 3; do
        echo "## w4 model=$model point=$3 rate=$rate run $i"
        $B --model $model --pct50 $1 --pct75 $2 --rate $rate --progress 0 --json
      done
    done
  done
done
echo "## wake-cost (again)"; $B wake-cost
echo "## mem-latency (again)"; $B mem-latency
echo "## find-max-rate kafka"; $B --find-max-rate --rate 250000 --progress 0
echo "## find-max-rate watch"; $B --find-max-rate --model watch --rate 100000 --progress 0
echo "## criterion purgatory"; bench-results/criterion.sh purgatory
echo "# done $(date -u)"
