#!/bin/bash
# The measurement campaign behind README.md "Performance": every workload in turn, raw output on
# stdout (bench-results/2026-11-22-session2.txt is its output). Build first: cargo build --release
# && cargo bench --no-run. Takes about 15 minutes on 2 cores.
cd "$(dirname "$0")/.."
B=./target/release/kafka-timer
echo "# $(date -u) $(nproc) cpus; $(grep -m1 'model name' /proc/cpuinfo)"; rustc --version
echo "## wake-cost"; $B wake-cost
echo "## mem-latency"; $B mem-latency
echo "## w1 (fresh, all impls, bytes)"; $B w1
echo "## w1 --warm"; $B w1 --warm --no-bytes
echo "## w1x2"; $B w1x2
for i in 1 2 3; do echo "## w2 run $i"; $B w2; done
echo "## w3"; $B w3
echo "## w5"; $B w5 --impls wheel,system-timer-typed,system-timer-keyed,delay-queue
for model in kafka watch; do
  for point in "20 60 low" "200 400 high"; do
    set -- $point
    for rate in 50000 100000; do
      for i in 1 2 3; do
        echo "## w4 model=$model point=$3 rate=$rate run $i"
        $B --model $model --pct50 $1 --pct75 $2 --rate $rate --progress 0
      done
    done
  done
done
echo "## find-max-rate kafka"; $B --find-max-rate --rate 250000 --progress 0
echo "## find-max-rate watch"; $B --find-max-rate --model watch --rate 100000 --progress 0
echo "## criterion timer"; bench-results/criterion.sh timer
echo "## criterion wheel"; bench-results/criterion.sh wheel
echo "## criterion purgatory"; bench-results/criterion.sh purgatory
echo "# done $(date -u)"
