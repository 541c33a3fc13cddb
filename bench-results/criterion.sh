#!/bin/bash
# criterion.sh BENCH [criterion args]: runs one criterion bench and keeps each benchmark's name
# and its `time:` line. A long name is printed on a line of its own, above its `time:` line:
# keep every line that starts in column 0 (a name) except criterion's and cargo's own messages.
cd "$(dirname "$0")/.."
bench=$1
shift
cargo bench --bench "$bench" -- "$@" 2>&1 \
  | grep -E '^[^ ]|time:' \
  | grep -vE '^(Benchmarking|Found|Gnuplot|WARNING|Warning|Running|Compiling|Finished|Downloaded|Downloading|Updating|Locking)'
