#!/bin/sh
# Publishes a run of tools/bench.sh into the repository, for a commit:
#
#   tools/publish_bench.sh [DIR]      (DIR: bench.sh's --out, default bench/out)
#
# copies DIR/table.md and DIR's plots to docs/bench/ (the plots of an earlier
# run go) and puts DIR/headline.md, a link to the full table and the plots
# between the lines <!-- bench:begin --> and <!-- bench:end --> of README.md.
# It copies DIR as it is: to publish an older run with a newer report, run
# bench/report.py on DIR's JSON first, as the end of bench.sh does.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bench/out}
docs="$root/docs/bench"
readme="$root/README.md"
for f in table.md headline.md; do
    [ -f "$out/$f" ] || { echo "publish_bench.sh: no $out/$f (run tools/bench.sh)" >&2; exit 1; }
done
for marker in '<!-- bench:begin -->' '<!-- bench:end -->'; do
    [ "$(grep -cxF "$marker" "$readme")" = 1 ] ||
        { echo "publish_bench.sh: README.md needs one line $marker" >&2; exit 1; }
done

block=$(mktemp)
trap 'rm -f "$block" "$readme.new"' EXIT
plots=
for plot in attention layer_seq layer decode; do
    if [ -f "$out/$plot.png" ]; then plots="$plots $plot"; fi
done
{
    cat "$out/headline.md"
    echo
    echo "Every shape, ISA and peer, and what was not measured: [docs/bench/table.md](docs/bench/table.md)."
    echo
    for plot in $plots; do
        case $plot in
        attention) alt="attention GFLOP/s against sequence length" ;;
        layer_seq) alt="whole layer GFLOP/s against sequence length" ;;
        layer) alt="BERT-base layer" ;;
        decode) alt="decode time against Skv per cache type, with the roofline" ;;
        esac
        echo "![$alt](docs/bench/$plot.png)"
    done
} >"$block"
# The lines between the markers give way to $block (fails when end comes first).
awk -v block="$block" '
    $0 == "<!-- bench:end -->" { inside = 0 }
    !inside { print }
    $0 == "<!-- bench:begin -->" { while ((getline line < block) > 0) print line; inside = 1 }
    END { exit inside }
' "$readme" >"$readme.new"
mkdir -p "$docs"
rm -f "$docs"/*.png
cp "$out/table.md" "$docs/table.md"
for plot in $plots; do
    cp "$out/$plot.png" "$docs/"
done
mv "$readme.new" "$readme"
echo "published $out to docs/bench/ and README.md" >&2
