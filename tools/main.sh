#!/usr/bin/env bash
# The main job: set up, build, validate every ISA this CPU has against the
# reference on BERT-base (B=8, S=128, d_model 768, 12 heads) and report CPU,
# ISAs, max errors and the layer's time per ISA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build
exec build/tools/mha-validate --report
