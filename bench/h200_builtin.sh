#!/usr/bin/env bash
# The built-in suite on the lent H200, in steps that each fit one device call (the machine keeps $WORK while warm):
#   h200_builtin.sh run      -- copy this tree into a fresh git repository ($WORK/repo, one commit), time
#                               `harness run` of jobs/builtin.toml there (stops itself after $LIMIT s, default 540),
#                               then export the run (complete or not) as $OUT/h200-<sha>.bundle with the log
#   h200_builtin.sh resume   -- `harness run --resume` the same run (a second call when one was not enough), export
# SUITE: a suite file of this tree to run instead of jobs/builtin.toml. Needs MLX (source .whlB/setup.sh first) and git.
set -uo pipefail
STEP=${1:?usage: h200_builtin.sh run|resume}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$HOME/h200-builtin}
OUT=${OUT:-$WORK/out}
LIMIT=${LIMIT:-540}
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled HARNESS_CACHE=$WORK/cache PYTHONPATH="$ROOT:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
DB="sqlite:///$WORK/h200.db"
harness() { python3 -c "from harness.cli.main import main; main()" "$@"; }
g() { git -C "$WORK/repo" -c user.email=h200@example.com -c user.name=h200 "$@"; }
mkdir -p "$WORK" "$OUT"

export_run() {
  local sha run
  sha=$(g rev-parse --short=7 HEAD)
  run=$(python3 -c "
from harness.record import query
from harness.record.outbox import open_store
store = open_store('$DB')
print(query.latest_run(store, query.chips(store)[0]['key']).id)")  # the run, also when stopped before its end
  echo "$run" > "$WORK/run.id"
  harness export --db "$DB" --run "$run" --out "$OUT/h200-$sha.bundle" || echo "export failed"
  harness noise --db "$DB" > "$OUT/noise.txt" 2>&1 || true
  cp "$WORK/run.log" "$OUT/$1.log"
}

timed() {  # $1: label, rest: harness args; wall seconds appended to $OUT/seconds.txt
  local label=$1 start end status; shift
  start=$(date +%s.%N)
  timeout "$LIMIT" python3 -c "from harness.cli.main import main; main()" "$@" 2>&1 | tee -a "$WORK/run.log" \
    | grep -v '^progress' ; status=${PIPESTATUS[0]}
  end=$(date +%s.%N)
  python3 -c "print('$label', f'{$end - $start:.1f} s', 'exit', $status)" | tee -a "$WORK/seconds.txt"
  cp "$WORK/seconds.txt" "$OUT/"
}

case "$STEP" in
  run)
    rm -rf "$WORK/repo" "$WORK/h200.db" "$WORK/run.log" "$WORK/seconds.txt"
    if git -C "$ROOT" rev-parse -q --verify HEAD >/dev/null; then
      # A clone of the project (git clone of a bundle): run its own commit, so the bundle's sha and parents are the
      # project's and its runs line up with the other chips' history.
      git clone -q "$ROOT" "$WORK/repo" || exit 1
    else
      mkdir -p "$WORK/repo"
      (cd "$ROOT" && tar cf - --exclude=./.whlA --exclude=./.whlB --exclude=./.venv --exclude=./.dev \
        --exclude=./harness-out .) | tar xf - -C "$WORK/repo"
      g init -q && g add -A && g commit -qm "h200 builtin run" || exit 1
    fi
    python3 -c "import mlx.core as mx; print(mx.device_info())"
    timed run run --repo "$WORK/repo" --db "$DB" --no-report ${SUITE:+--suite "$WORK/repo/$SUITE"}
    export_run run
    ;;
  resume)
    timed resume run --repo "$WORK/repo" --db "$DB" --no-report --resume "$(cat "$WORK/run.id")" \
      ${SUITE:+--suite "$WORK/repo/$SUITE"}
    export_run resume
    ;;
  *) echo "unknown step $STEP" >&2; exit 2 ;;
esac
