#!/usr/bin/env bash
# Fuzzes libmha for N seconds (default 600): clang, libFuzzer, ASan + UBSan,
# every ISA of this CPU against the scalar reference. The corpus grows in
# build-fuzz/corpus; a finding is written as build-fuzz/crash-* (replay it with
# build-fuzz/tests/fuzz_mha FILE) and should become a regression test: its input
# goes to tests/fuzz_seeds, which every run replays first (clang's bounds checks
# see pointer arithmetic that GCC's sanitizer builds of the suites do not).
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
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
rc=0
"$dir/tests/fuzz_mha" tests/fuzz_seeds/* >"$dir/seeds.log" 2>&1 || rc=$?
echo "fuzz seeds (earlier findings): $(grep -c '^Executed' "$dir/seeds.log") replayed"
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$dir/seeds.log"
  exit 1
fi
"$dir/tests/fuzz_mha" -max_total_time="$seconds" -seed=1 -print_final_stats=1 \
  -artifact_prefix="$dir/" "$dir/corpus" tests/fuzz_seeds >"$dir/fuzz.log" 2>&1 || rc=$?
grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" "$dir/fuzz.log" || true
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$dir/fuzz.log"
  exit 1
fi
