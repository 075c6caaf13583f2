#!/bin/sh
# Replays the analysis bench's stream with `main`'s library and with the working tree's, the
# same bench source for both, alternately, and prints each run's figures and the ratios.
#
#   scripts/compare_analysis_with_main.sh [runs]     (from the repository root; default 3 runs)
#
# Builds `main` from `git archive` in $CARGO_TARGET_DIR/compare-main (nothing in the working
# tree or in git changes). HIGHWATER_BENCH_EVENTS and HIGHWATER_BENCH_REPEAT are passed on.
set -eu
runs=${1:-3}
target=${CARGO_TARGET_DIR:-target}
base=$target/compare-main
rm -rf "$base/src-tree"
mkdir -p "$base/src-tree"
git archive main | tar -x -C "$base/src-tree"
rm -rf "$base/src-tree/benches/analysis"
cp -r benches/analysis "$base/src-tree/benches/analysis"
binary() {
    cargo bench --bench analysis --no-run --message-format=json "$@" 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}
ours=$(binary)
theirs=$(cd "$base/src-tree" && CARGO_TARGET_DIR="$(cd "$base" && pwd)/target" binary)
export HIGHWATER_BENCH_TIMELINE_ONLY=1
i=0
while [ "$i" -lt "$runs" ]; do
    printf 'main:    '; "$theirs" --bench | sed -n 's/^timeline-only: //p'
    printf 'branch:  '; "$ours" --bench | sed -n 's/^timeline-only: //p'
    i=$((i + 1))
done
