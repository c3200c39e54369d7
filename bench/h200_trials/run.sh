#!/usr/bin/env bash
# The H200 check of trial-level verdicts, in steps that each fit one device call (see bench/README.md):
#   run.sh base   -- copy this tree into a fresh git repository ($WORK/repo: commit "base", then an empty commit
#                    "head": identical kernels), time the suite at base
#   run.sh head   -- time the suite at head, then compare, variants, noise and bundles into $OUT
#   run.sh both   -- base, then head (for a suite short enough for one call: SUITE=planted.toml)
# Needs MLX (source .whlB/setup.sh first) and git; state lives in $WORK (default $HOME/h200-trials).
# SUITE: a suite file beside this script (default suite.toml).
set -euo pipefail
STEP=${1:?usage: run.sh base|head}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-$HOME/h200-trials}
OUT=${OUT:-$WORK/out}
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled HARNESS_CACHE=$WORK/cache PYTHONPATH="$ROOT:${PYTHONPATH:-}"
DB="sqlite:///$WORK/h200.db"
SUITE=${SUITE:-suite.toml}
harness() { python3 -c "from harness.cli.main import main; main()" "$@"; }
mkdir -p "$WORK" "$OUT"
g() { git -C "$WORK/repo" -c user.email=h200@example.com -c user.name=h200 "$@"; }

timed_run() {  # $1: base|head; the run id to $WORK/$1.run, the wall time to $WORK/$1.seconds
  local sha start end
  sha=$(g rev-parse "$1")
  start=$(date +%s.%N)
  harness run --repo "$WORK/repo" --commit "$sha" --suite "$WORK/repo/bench/h200_trials/$SUITE" \
    --db "$DB" --no-report 2>&1 | tee "$WORK/$1.log" | grep -v '^progress' || true
  end=$(date +%s.%N)
  grep -o 'run [0-9a-f]\{32\}' "$WORK/$1.log" | head -1 | cut -d' ' -f2 > "$WORK/$1.run"
  python3 -c "print(f'{$end - $start:.1f}')" > "$WORK/$1.seconds"
  echo "$1 run $(cat "$WORK/$1.run") in $(cat "$WORK/$1.seconds") s"
}

setup() {
  rm -rf "$WORK/repo" "$WORK/h200.db"
  mkdir -p "$WORK/repo"
  # not .git: from a clone of the project, the copy must be a repository of its own (two commits, base and head)
  (cd "$ROOT" && tar cf - --exclude=./.git --exclude=./.whlA --exclude=./.whlB --exclude=./.dev --exclude=./.venv \
    --exclude=./harness-out .) | tar xf - -C "$WORK/repo"
  g init -q && g add -A && g commit -qm base && g branch -f base
  g commit -q --allow-empty -m "head: nothing changed" && g branch -f head
  python3 -c "import mlx.core as mx; print(mx.device_info())"
}

reports() {
  local base head
  base=$(cat "$WORK/base.run"); head=$(cat "$WORK/head.run")
  harness compare "$base" "$head" --db "$DB" --format json > "$OUT/compare.json" || true
  harness compare "$base" "$head" --db "$DB" --all > "$OUT/compare.txt" || true
  for side in base head; do
    harness variants --commit "$(g rev-parse "$side")" --db "$DB" --format json > "$OUT/variants-$side.json" || true
  done
  harness noise --db "$DB" --series > "$OUT/noise.txt" || true
  harness noise --db "$DB" --format json > "$OUT/noise.json" || true
  for side in base head; do
    harness export --db "$DB" --run "$(cat "$WORK/$side.run")" --out "$OUT/h200-trials-$side.bundle" || true
    cp "$WORK/$side.seconds" "$WORK/$side.log" "$OUT/" || true
  done
}

case "$STEP" in
  both)
    setup
    timed_run base
    timed_run head
    reports
    ;;
  base)
    setup
    timed_run base
    ;;
  head)
    timed_run head
    reports
    ;;
  *) echo "unknown step $STEP" >&2; exit 2 ;;
esac
