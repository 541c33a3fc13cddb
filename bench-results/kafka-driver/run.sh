#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the W4 Kafka driver built by build.sh; flags as ./target/release/kafka-timer's
# (see README.md), e.g. bench-results/kafka-driver/run.sh --model watch --rate 50000 --json
#   BUILD_DIR=...  (default: target/kafka-driver under the repository root, as build.sh)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/target/kafka-driver}")

if [ ! -f "$build/classes/kafkatimer/W4Driver.class" ]; then
  echo "run.sh: the driver is not built ($build/classes/kafkatimer/W4Driver.class missing):" \
    "run KAFKA_SRC=/path/to/kafka bench-results/kafka-driver/build.sh first" >&2
  exit 1
fi
command -v java >/dev/null || { echo "run.sh: java not found" >&2; exit 1; }
exec java -XX:+UseG1GC -Xms1g -Xmx1g -cp "$build/classes" kafkatimer.W4Driver "$@"
