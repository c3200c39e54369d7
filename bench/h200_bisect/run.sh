#!/usr/bin/env bash
# `harness bisect` and null/planted pairs on the lent H200, in steps that each fit one device call (the machine keeps
# $WORK while warm; see bench/README.md):
#   run.sh bisect  -- a generated repository of 17 commits (make_repo.py: c6 makes the CUDA kernel read 3 % more bytes,
#                     c11 drops the tail of rows not a multiple of the tile): `harness bisect --mode correctness`,
#                     then `--mode perf`, each timed, JSON answers to $OUT
#   run.sh pairs   -- make_repo.py --pairs: runs of base, null (identical code) and planted (2 % more bytes), each
#                     shape timed pipelined and on the device clock; `harness compare` base..null and base..planted,
#                     then `--settle` of each (re-measures the undecided series only; $SETTLE_LIMIT s each)
#   run.sh settle  -- `harness compare --settle` of both pairs again (a second call, when the first ran out)
# Needs MLX (source .whlB/setup.sh first) and git.
set -uo pipefail
STEP=${1:?usage: run.sh bisect|pairs|settle}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-$HOME/h200-bisect}
OUT=${OUT:-$WORK/out}
LIMIT=${LIMIT:-400}
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled HARNESS_CACHE=$WORK/cache PYTHONPATH="$ROOT:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
mkdir -p "$WORK" "$OUT"
sha() { git -C "$WORK/gkp" rev-parse "$1"; }  # a commit of the pairs repository
timed() {  # $1: label, rest: harness args; stdout to $OUT/<label>.out, the rest to $OUT/<label>.log
  local label=$1 start end status; shift
  start=$(date +%s.%N)
  timeout "$LIMIT" python3 -c "from harness.cli.main import main; main()" "$@" > "$OUT/$label.out" 2> "$OUT/$label.log"
  status=$?
  end=$(date +%s.%N)
  python3 -c "print('$label', f'{$end - $start:.1f} s', 'exit', $status)" | tee -a "$WORK/seconds.txt"
  cp "$WORK/seconds.txt" "$OUT/"
  tail -c 600 "$OUT/$label.out"
}
python3 -c "import mlx.core as mx; print(mx.default_device(), mx.device_info().get('device_name'))"
case "$STEP" in
  bisect)
    rm -rf "$WORK/gk" "$WORK/bisect.db"
    python3 "$HERE/make_repo.py" "$WORK/gk" > "$WORK/gk.shas" || exit 1
    good=$(head -1 "$WORK/gk.shas"); bad=$(tail -1 "$WORK/gk.shas")
    cat -n "$WORK/gk.shas" > "$OUT/gk-shas.txt"
    DB="sqlite:///$WORK/bisect.db"
    timed bisect-correctness bisect --good "$good" --bad "$bad" --kernel unit --check test_tail --mode correctness \
      --repo "$WORK/gk" --db "$DB" --format json
    timed bisect-perf bisect --good "$good" --bad "$bad" --kernel rowsum --mode perf --repo "$WORK/gk" --db "$DB" \
      --format json
    cp "$WORK/bisect.db" "$OUT/bisect.db" 2>/dev/null
    ;;
  pairs)
    rm -rf "$WORK/gkp" "$WORK/pairs.db"
    python3 "$HERE/make_repo.py" --pairs "$WORK/gkp" | tee "$OUT/gkp-shas.txt" || exit 1
    DB="sqlite:///$WORK/pairs.db"
    for side in base null planted; do
      timed "run-$side" run --repo "$WORK/gkp" --commit "$side" --db "$DB" --no-report
    done
    timed compare-null compare "$(sha base)" "$(sha null)" --db "$DB" --format json
    timed compare-planted compare "$(sha base)" "$(sha planted)" --db "$DB" --format json
    cp "$WORK/pairs.db" "$OUT/pairs.db"
    LIMIT=${SETTLE_LIMIT:-150}
    timed settle-null compare "$(sha base)" "$(sha null)" --settle --repo "$WORK/gkp" --db "$DB" --format json
    timed settle-planted compare "$(sha base)" "$(sha planted)" --settle --repo "$WORK/gkp" --db "$DB" --format json
    cp "$WORK/pairs.db" "$OUT/pairs.db"
    ;;
  settle)
    DB="sqlite:///$WORK/pairs.db"
    timed settle-null compare "$(sha base)" "$(sha null)" --settle --repo "$WORK/gkp" --db "$DB" --format json
    timed settle-planted compare "$(sha base)" "$(sha planted)" --settle --repo "$WORK/gkp" --db "$DB" --format json
    cp "$WORK/pairs.db" "$OUT/pairs.db"
    ;;
  *) echo "unknown step $STEP" >&2; exit 2 ;;
esac
