#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the W4 Kafka driver: copies Kafka's ten server-common files from a Kafka source tree
# OUTSIDE this repository into the build dir, checks them against the pinned blob hashes, and
# compiles them with this directory's stubs and driver (javac --release 17).
#
#   KAFKA_SRC=/path/to/apache-kafka-checkout bench-results/kafka-driver/build.sh
#   BUILD_DIR=...  (default: target/kafka-driver under the repository root, git-ignored)
#
# Kafka's files are never copied into the repository's tracked tree: they go to the build dir.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/target/kafka-driver}")

die() { echo "build.sh: $*" >&2; exit 1; }

[ -n "${KAFKA_SRC:-}" ] || die "KAFKA_SRC is not set: point it at an Apache Kafka source tree (git clone https://github.com/apache/kafka), e.g. KAFKA_SRC=\$HOME/kafka $0"
[ -d "$KAFKA_SRC" ] || die "KAFKA_SRC=$KAFKA_SRC is not a directory"
KAFKA_SRC=$(cd "$KAFKA_SRC" && pwd)
case "$KAFKA_SRC/" in
  "$root"/*) die "KAFKA_SRC=$KAFKA_SRC is inside this repository: Kafka's sources must stay outside it" ;;
esac
case "$build/" in
  "$root"/target/*) ;;
  "$root"/*) die "BUILD_DIR=$build is inside the repository but not under target/ (git-ignored): Kafka's files must not land in the tracked tree" ;;
esac
command -v javac >/dev/null || die "javac not found (a JDK 17 or later is needed)"
command -v git >/dev/null || die "git not found (used for git hash-object)"

# Kafka's files: path in a Kafka tree, and the blob hash (git hash-object) of the version this
# driver was written and checked against (see README.md for the commits).
pinned=(
  "server-common/src/main/java/org/apache/kafka/server/purgatory/DelayedOperation.java f3c818cb9c6c6f7487891103570258f438e5b842"
  "server-common/src/main/java/org/apache/kafka/server/purgatory/DelayedOperationPurgatory.java 380f22c9c8ec843a1b7ee3df57559d7c2185176a"
  "server-common/src/main/java/org/apache/kafka/server/purgatory/DelayedOperationKey.java edac7bdf1cbe758eb4860d0dbfb60fd965fbc363"
  "server-common/src/main/java/org/apache/kafka/server/util/timer/Timer.java b3c500f565c519e6e68e17add61a9b3f24e41b85"
  "server-common/src/main/java/org/apache/kafka/server/util/timer/SystemTimer.java 15b22bb3e8dfe87462ea12919dfb3190ffc32007"
  "server-common/src/main/java/org/apache/kafka/server/util/timer/TimerTask.java ec6e8b3d783ac769f3c6cb93568c962e2d6e9550"
  "server-common/src/main/java/org/apache/kafka/server/util/timer/TimerTaskEntry.java 02131ecb27db82ccae6f35e28c3736c7e5a67418"
  "server-common/src/main/java/org/apache/kafka/server/util/timer/TimerTaskList.java fe965565256e55a7bfaafa1a03152b602681497e"
  "server-common/src/main/java/org/apache/kafka/server/util/timer/TimingWheel.java 43fae38f65e213228355f8f1923285bf4382c1ee"
  "server-common/src/main/java/org/apache/kafka/server/util/ShutdownableThread.java 4268af92f84f588bf183643ea731c2685eb0857e"
)

for entry in "${pinned[@]}"; do
  path=${entry% *}
  [ -f "$KAFKA_SRC/$path" ] || die "missing in KAFKA_SRC: $path (is $KAFKA_SRC a Kafka checkout with server-common's purgatory and timer in Java, 2024 or later?)"
done

# The build dir is emptied first: only one this script made (or a new or empty one).
if [ -d "$build" ] && [ -n "$(ls -A "$build")" ] && [ ! -f "$build/pinned.txt" ]; then
  die "BUILD_DIR=$build exists, is not empty and was not made by this script: not emptying it"
fi
rm -rf "$build"
mkdir -p "$build/kafka-src" "$build/classes"
printf '%s\n' "${pinned[@]}" > "$build/pinned.txt" # also marks the dir as this script's

echo "Kafka's files from $KAFKA_SRC:"
mismatches=0
for entry in "${pinned[@]}"; do
  path=${entry% *}
  want=${entry##* }
  mkdir -p "$build/kafka-src/$(dirname "$path")"
  cp "$KAFKA_SRC/$path" "$build/kafka-src/$path"
  got=$(git hash-object "$build/kafka-src/$path")
  if [ "$got" = "$want" ]; then
    printf '  %s  matches  %s\n' "$got" "$path"
  else
    printf '  %s  DIFFERS (pinned %s)  %s\n' "$got" "$want" "$path"
    mismatches=$((mismatches + 1))
  fi
done
if [ "$mismatches" -gt 0 ]; then
  echo "build.sh: warning: $mismatches of ${#pinned[@]} files differ from the pinned versions (another Kafka version): the figures are for that version's code" >&2
else
  echo "all ${#pinned[@]} files match the pinned blob hashes"
fi
top=$(git -C "$KAFKA_SRC" rev-parse --show-toplevel 2>/dev/null || true)
if [ -n "$top" ] && [ "$(cd "$top" && pwd)" = "$KAFKA_SRC" ]; then
  echo "Kafka tree at commit $(git -C "$KAFKA_SRC" rev-parse HEAD)" | tee "$build/kafka-commit.txt"
fi

mapfile -t sources < <(
  find "$here/stubs" "$build/kafka-src" "$here/src" -name '*.java' | sort
)
echo "javac --release 17: ${#sources[@]} files ($(javac -version 2>&1))"
javac --release 17 -encoding UTF-8 -d "$build/classes" "${sources[@]}"
if [ -n "${BUILD_DIR:-}" ]; then
  echo "built: $build/classes (run: BUILD_DIR=$BUILD_DIR bench-results/kafka-driver/run.sh --json)"
else
  echo "built: $build/classes (run: bench-results/kafka-driver/run.sh --json)"
fi
