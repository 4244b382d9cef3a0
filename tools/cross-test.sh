#!/bin/sh
# Cross-builds libmha for AArch64 (gcc-aarch64-linux-gnu, tools/cross/aarch64-linux-gnu.ini)
# with -Dwerror=true and runs the whole Meson test suite under qemu-aarch64 twice,
# thinned by MHA_TEST_QUICK: the tests of the neon suite with MHA_ISA=neon, those of
# the scalar suite with MHA_ISA=scalar, then any test in neither. Exits nonzero on
# any failure.
#
#   tools/cross-test.sh [build-dir]      (default: build-aarch64, relative to the cwd)
#
# Needs: gcc-aarch64-linux-gnu qemu-user meson ninja-build, and libcmocka-dev:arm64
# libgomp1:arm64 (dpkg --add-architecture arm64). Tests run with their own
# OpenMP thread counts: on Debian's arm64 runtime libgomp works under qemu-user
# (see the exe_wrapper note in the cross file).
set -eu

src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-aarch64}

if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" "$src" -Dwerror=true
else
    meson setup "$build" "$src" --cross-file "$src/tools/cross/aarch64-linux-gnu.ini" -Dwerror=true
fi
meson compile -C "$build"

status=0
# Under qemu (about 20x slower) the suites run thinned (MHA_TEST_QUICK): every path,
# tail and mask kind stays, the largest sweeps go; the shared kernels run whole on
# the build machine, and test_kernels and test_simd drive NEON's table and layer at
# every edge of their contracts in either mode.
MHA_TEST_QUICK=1
export MHA_TEST_QUICK
for isa in neon scalar; do
    echo "== meson test --suite $isa, MHA_ISA=$isa, MHA_TEST_QUICK (qemu-aarch64)"
    MHA_ISA=$isa meson test -C "$build" --suite "$isa" --print-errorlogs \
        --logbase "testlog-$isa" || status=1
done
echo "== meson test, tests in neither ISA suite"
if meson test -C "$build" --list --no-suite neon --no-suite scalar 2>/dev/null | grep -q .; then
    meson test -C "$build" --no-suite neon --no-suite scalar --print-errorlogs --logbase testlog-other || status=1
else
    echo "(none)"
fi

if [ "$status" -ne 0 ]; then
    echo "cross-test: FAILED" >&2
    exit 1
fi
echo "cross-test: all passed"
