#!/usr/bin/env bash
# Every test of libmha, from a fresh Debian 12 machine:
#  - native build with warnings as errors; each cmocka suite once per ISA this
#    CPU has (MHA_ISA), the float64 PyTorch interop test, mha-validate's sweep,
#    the README example, `meson install` + pkg-config, and a CMake project using
#    find_package(mha);
#  - the Python package: `pip install .` into a venv with torch 2 and transformers,
#    its pytest suite (against float64 numpy and PyTorch, torch's SDPA, Hugging Face
#    models on eager attention) and the README's Python examples;
#  - the whole suite under ASan + UBSan, the cmocka suites under UBSan at -O0,
#    and under valgrind memcheck for the SIMD ISAs valgrind runs (sweeps thinned by
#    MHA_TEST_QUICK; their comparisons run the scalar reference under it too);
#  - the libFuzzer target for MHA_FUZZ_SECONDS (default 60);
#  - the benchmark harness in --quick mode (it must run; timings are not judged);
#  - the NEON build cross-compiled for AArch64, its whole suite under qemu (thinned), and
#    its outputs on fixed inputs against the x86 scalar reference.
# Ends with the wall time of each stage and one line "N passed, M failed, K
# skipped" over all of them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

passed=0 failed=0 skipped=0 runs=0
# stage NAME: prints the stage's header and starts its clock; the end prints each
# stage's wall time.
stage_names=() stage_starts=()
stage() {
  echo "== $1"
  stage_names+=("$1") stage_starts+=("$(date +%s)")
}

stage "setup: what is missing, from Debian's packages"
bash tools/setup.sh --all
# Runs `meson test` in build dir $1 with the rest as arguments, and adds its
# results to the totals; a failure is counted, not fatal, so every part runs.
run_suite() {
  local dir=$1; shift
  local rc=0
  # Each run writes its own log, run<N>.testlog[-<wrapper>].json: reading a fixed
  # name would count another run's results.
  runs=$((runs + 1))
  meson test -C "$dir" --print-errorlogs --logbase "run$runs.testlog" "$@" || rc=$?
  local counts
  counts=$(/usr/bin/python3 - "$dir"/meson-logs/run$runs.testlog*.json <<'PY'
import json, sys
ok = fail = skip = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"): ok += 1
    elif r == "SKIP": skip += 1
    else: fail += 1
print(ok, fail, skip)
PY
)
  read -r ok fail skip <<<"$counts"
  [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ] && fail=1
  passed=$((passed + ok)) failed=$((failed + fail)) skipped=$((skipped + skip))
}

# Configures (or reconfigures) build dir $1 with the remaining options, then builds.
build() {
  local dir=$1; shift
  local log
  log=$(mktemp)
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >"$log" 2>&1 || { cat "$log"; return 1; }
  else
    meson setup "$dir" "$@" >"$log" 2>&1 || { cat "$log"; return 1; }
  fi
  ninja -C "$dir" >"$log" 2>&1 || { cat "$log"; return 1; }
  rm -f "$log"
}

stage "native build (warnings as errors)"
native=build-test
build "$native" -Dwerror=true
run_suite "$native"

stage "README example, install and pkg-config"
staging=$(mktemp -d)
DESTDIR="$staging" meson install -C "$native" --quiet
prefix=$(meson introspect "$native" --buildoptions | /usr/bin/python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
pc_dir=$(dirname "$(find "$staging" -name mha.pc | head -n 1)")
# Every complete C program of the README (a block with main) must build against the
# installed library and run.
n_examples=$(/usr/bin/python3 - README.md "$staging/example" <<'PY'
import re, sys
blocks = [b for b in re.findall(r"```c\n(.*?)```", open(sys.argv[1]).read(), re.S) if "int main(" in b]
for i, b in enumerate(blocks):
    open(f"{sys.argv[2]}{i}.c", "w").write(b)
print(len(blocks))
PY
)
for i in $(seq 0 $((n_examples - 1))); do
  if PKG_CONFIG_SYSROOT_DIR="$staging" PKG_CONFIG_PATH="$pc_dir" \
     cc -std=c11 -Wall -Werror "$staging/example$i.c" -o "$staging/example$i" \
       $(PKG_CONFIG_SYSROOT_DIR="$staging" PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs --static mha) -lm &&
     LD_LIBRARY_PATH="$staging$prefix/lib:$staging$prefix/lib/x86_64-linux-gnu" "$staging/example$i"; then
    echo "README example $i: ok"; passed=$((passed + 1))
  else
    echo "README example $i: FAILED"; failed=$((failed + 1))
  fi
done
if cmake -S tests/cmake -B "$staging/cmake" -DCMAKE_PREFIX_PATH="$staging$prefix" >"$staging/cmake.log" 2>&1 &&
   cmake --build "$staging/cmake" >>"$staging/cmake.log" 2>&1 && "$staging/cmake/app"; then
  echo "CMake find_package(mha) and mha::mha: ok"; passed=$((passed + 1))
else
  cat "$staging/cmake.log"
  echo "CMake find_package(mha) and mha::mha: FAILED"; failed=$((failed + 1))
fi
rm -rf "$staging"

stage "Python package: pip install ., pytest, the README's Python examples"
# The venv sees Debian's numpy and pytest (with xdist and timeout); meson-python, ninja,
# ml_dtypes (bfloat16 arrays), torch 2 (libmha.torch's custom op; about 2.5 GB, once:
# the venv stays in build-py) and transformers come from PyPI. A fixed build dir keeps
# rebuilds incremental.
venv=build-py/venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
if ! "$venv/bin/pip" install -q "torch>=2.4" "transformers>=4.56" >build-py/pip-torch.log 2>&1; then
  tail -n 20 build-py/pip-torch.log
  echo "pip install torch transformers: FAILED"; failed=$((failed + 1))
fi
if "$venv/bin/pip" install -q meson-python ninja "ml_dtypes<0.5" >build-py/pip.log 2>&1 &&
   "$venv/bin/pip" install -q --no-build-isolation --config-settings=build-dir="$root/build-py/build" . \
     >>build-py/pip.log 2>&1; then
  rm -f build-py/pytest.xml
  # Worker processes (pytest-xdist) and a per-test timeout that ends a hung worker
  # (pytest-timeout): a test that crashes or corrupts the library's process fails
  # alone, its worker is replaced and the rest still run.
  OMP_NUM_THREADS=2 "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 --max-worker-restart=50 \
    --timeout=300 --timeout-method=thread --junitxml=build-py/pytest.xml tests/python || true
  if [ -f build-py/pytest.xml ]; then
    read -r ok fail skip <<<"$(/usr/bin/python3 - build-py/pytest.xml <<'PY'
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
tests, fail, err, skip = (int(s.get(a)) for a in ("tests", "failures", "errors", "skipped"))
print(tests - fail - err - skip, fail + err, skip)
PY
)"
    passed=$((passed + ok)) failed=$((failed + fail)) skipped=$((skipped + skip))
  else
    echo "pytest: FAILED (no report)"; failed=$((failed + 1))
  fi
  # Every python block of README.md, each a complete program.
  mkdir -p build-py/examples && rm -f build-py/examples/*.py
  /usr/bin/python3 - README.md build-py/examples <<'PY'
import re, sys
for i, code in enumerate(re.findall(r"```python\n(.*?)```", open(sys.argv[1]).read(), re.S)):
    open(f"{sys.argv[2]}/example{i + 1}.py", "w").write(code)
PY
  for example in build-py/examples/*.py; do
    if (cd build-py && OMP_NUM_THREADS=2 venv/bin/python "../$example"); then
      echo "README Python $(basename "$example"): ok"; passed=$((passed + 1))
    else
      echo "README Python $(basename "$example"): FAILED"; failed=$((failed + 1))
    fi
  done
else
  tail -n 40 build-py/pip.log
  echo "pip install .: FAILED"; failed=$((failed + 1))
fi

stage "libmha as a Meson subproject"
parent=$(mktemp -d)
mkdir -p "$parent/subprojects"
ln -s "$root" "$parent/subprojects/mha"
cp README.md "$parent/"
/usr/bin/python3 - "$parent/README.md" "$parent/main.c" <<'PY'
import re, sys
open(sys.argv[2], "w").write(re.findall(r"```c\n(.*?)```", open(sys.argv[1]).read(), re.S)[0])
PY
cat >"$parent/meson.build" <<'MESON'
project('uses_mha', 'c', default_options: ['c_std=c11', 'mha:tests=false'])
executable('example', 'main.c', dependencies: [dependency('mha'), meson.get_compiler('c').find_library('m')])
MESON
if meson setup "$parent/build" "$parent" >/dev/null && ninja -C "$parent/build" >/dev/null &&
   "$parent/build/example"; then
  echo "subproject: ok"; passed=$((passed + 1))
else
  echo "subproject: FAILED"; failed=$((failed + 1))
fi
rm -rf "$parent"

stage "without OpenMP"
build build-noomp -Dwerror=true -Dopenmp=disabled
run_suite build-noomp --no-suite interop --no-suite validate

stage "ASan + UBSan"
build build-asan -Dwerror=true -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false
# Sweeps thinned with MHA_TEST_QUICK: every path and tail, not the largest shapes.
MHA_TEST_QUICK=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 run_suite build-asan --no-suite interop

stage "UBSan at -O0"
# At -O0 every operation is kept, so UBSan also sees those the optimizer folds
# away (an int32 product formed before its check); sweeps thinned with MHA_TEST_QUICK.
build build-ubsan-O0 -Dwerror=true -Dbuildtype=debug -Db_sanitize=undefined
MHA_TEST_QUICK=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  run_suite build-ubsan-O0 --no-suite interop --no-suite validate

stage "valgrind memcheck"
# The scalar suites are left out: every SIMD suite runs the scalar reference as its
# oracle under valgrind too, and on a 2-core Zen 1 they took 160 s of the stage's 420.
MHA_TEST_QUICK=1 run_suite "$native" --no-suite interop --no-suite validate --no-suite scalar \
  --wrapper "valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite"

stage "libFuzzer, ${MHA_FUZZ_SECONDS:-60} s"
if bash tools/fuzz.sh "${MHA_FUZZ_SECONDS:-60}"; then
  passed=$((passed + 1))
else
  echo "fuzzing: FAILED"; failed=$((failed + 1))
fi

stage "benchmark harness smoke test (tools/bench.sh --quick, no thresholds)"
mkdir -p build-bench
if bash tools/bench.sh --quick --out build-bench/quick >build-bench/quick.log 2>&1; then
  echo "bench --quick: ok"; passed=$((passed + 1))
else
  tail -n 40 build-bench/quick.log
  echo "bench --quick: FAILED"; failed=$((failed + 1))
fi

if [ -f tools/cross-test.sh ]; then
  stage "NEON build for AArch64 under qemu"
  bash tools/cross-test.sh build-aarch64 && cross_rc=0 || cross_rc=$?
  for log in build-aarch64/meson-logs/testlog-*.json; do
    [ -f "$log" ] || continue
    read -r ok fail skip <<<"$(/usr/bin/python3 -c '
import json, sys
rs = [json.loads(l)["result"] for l in open(sys.argv[1])]
print(sum(r == "OK" for r in rs), sum(r not in ("OK", "SKIP", "EXPECTEDFAIL") for r in rs), sum(r == "SKIP" for r in rs))' "$log")"
    passed=$((passed + ok)) failed=$((failed + fail)) skipped=$((skipped + skip))
  done
  [ "$cross_rc" -ne 0 ] && failed=$((failed + 1))

  stage "NEON under qemu against the x86 scalar reference, fixed inputs"
  MHA_ISA=scalar "$native/tools/mha-dump" >build-aarch64/x86-scalar.bin
  if MHA_ISA=neon qemu-aarch64 build-aarch64/tools/mha-dump >build-aarch64/neon.bin &&
     /usr/bin/python3 tools/compare_dumps.py build-aarch64/x86-scalar.bin build-aarch64/neon.bin; then
    passed=$((passed + 1))
  else
    echo "NEON vs x86 scalar: FAILED"; failed=$((failed + 1))
  fi
fi

end=$(date +%s)
echo
echo "time per stage (s):"
for i in "${!stage_names[@]}"; do
  next=${stage_starts[$((i + 1))]:-$end}
  printf '  %5d  %s\n' $((next - stage_starts[i])) "${stage_names[i]}"
done
printf '  %5d  total\n' $((end - stage_starts[0]))
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
