#!/usr/bin/env bash
# Fuzzes libmha for N seconds (default 600): clang, libFuzzer, ASan + UBSan,
# every ISA of this CPU against the scalar reference. The corpus grows in
# build-fuzz/corpus; a finding is written as build-fuzz/crash-* (replay it with
# build-fuzz/tests/fuzz_mha FILE) and should become a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
dir=build-fuzz
if [ ! -f "$dir/build.ninja" ]; then
  CC=clang meson setup "$dir" -Dfuzz=true -Dtests=false -Dopenmp=disabled \
    -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
ninja -C "$dir" >/dev/null
mkdir -p "$dir/corpus"
rc=0
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$dir/tests/fuzz_mha" \
  -max_total_time="$seconds" -seed=1 -print_final_stats=1 -artifact_prefix="$dir/" \
  "$dir/corpus" >"$dir/fuzz.log" 2>&1 || rc=$?
grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" "$dir/fuzz.log" || true
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$dir/fuzz.log"
  exit 1
fi
