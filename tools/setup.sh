#!/usr/bin/env bash
# Installs what libmha needs on Debian 12, and nothing when it is all there
# already. Runs apt-get as root (or via sudo).
#   tools/setup.sh          the build and the main job (tools/main.sh)
#   tools/setup.sh --all    every test too: PyTorch, sanitizers, valgrind,
#                           libFuzzer, the AArch64 cross build under qemu, the
#                           benchmark harness, the Python package (venv, pip,
#                           pytest; meson-python comes from PyPI) and CMake
set -euo pipefail

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

native=(meson ninja-build pkg-config gcc libcmocka-dev)
cross=()
if [ "${1:-}" = "--all" ]; then
  native+=(g++ python3-torch python3-numpy valgrind clang libclang-rt-14-dev libopenblas-dev
           libbenchmark-dev python3-matplotlib python3-venv gcc-aarch64-linux-gnu
           g++-aarch64-linux-gnu qemu-user python3-pip python3-pytest
           python3-pytest-xdist python3-pytest-timeout cmake)
  cross=(libcmocka-dev:arm64 libgomp1:arm64)
fi

missing=()
for p in "${native[@]}" "${cross[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
if [ ${#cross[@]} -gt 0 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  as_root dpkg --add-architecture arm64
fi
as_root apt-get update -q
DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
