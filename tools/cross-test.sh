#!/bin/sh
# Cross-builds libmha for AArch64 (gcc-aarch64-linux-gnu, tools/cross/aarch64-linux-gnu.ini)
# with -Dwerror=true and runs the whole Meson test suite under qemu-aarch64 twice: the
# tests of the neon suite with MHA_ISA=neon, those of the scalar suite with
# MHA_ISA=scalar, then any test in neither. Exits nonzero on any failure.
#
#   tools/cross-test.sh [build-dir]      (default: build-aarch64, relative to the cwd)
#
# Needs: gcc-aarch64-linux-gnu qemu-user meson ninja-build, and libcmocka-dev:arm64
# (dpkg --add-architecture arm64). OpenMP runs with one thread: libgomp with more
# threads hangs under qemu-user. QEMU_SET_ENV sets it inside the emulated process,
# so that it holds even where a test's own environment asks for more threads.
set -eu

src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-aarch64}

if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" "$src" -Dwerror=true
else
    meson setup "$build" "$src" --cross-file "$src/tools/cross/aarch64-linux-gnu.ini" -Dwerror=true
fi
meson compile -C "$build"

export OMP_NUM_THREADS=1
export QEMU_SET_ENV=OMP_NUM_THREADS=1
status=0
for isa in neon scalar; do
    echo "== meson test --suite $isa, MHA_ISA=$isa (qemu-aarch64)"
    MHA_ISA=$isa meson test -C "$build" --suite "$isa" --print-errorlogs || status=1
done
echo "== meson test, tests in neither ISA suite"
if meson test -C "$build" --list --no-suite neon --no-suite scalar 2>/dev/null | grep -q .; then
    meson test -C "$build" --no-suite neon --no-suite scalar --print-errorlogs || status=1
else
    echo "(none)"
fi

if [ "$status" -ne 0 ]; then
    echo "cross-test: FAILED" >&2
    exit 1
fi
echo "cross-test: all passed"
