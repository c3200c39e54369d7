#!/usr/bin/env bash
# What do trials cost? The built-in suite's benchmark sections (no correctness jobs), timed by `harness run` at one
# commit with `[timing] trials = R`, each run in a fresh database and MLX compile folder (MLX_PTX_CACHE_DIR: MLX
# compiles each CUDA source kernel in every job process, kernels/cuda_compile.py). One step per device call:
#   trial_cost.sh 1   -- trials = 1 (what one run cost before trials)
#   trial_cost.sh 3   -- trials = 3 (the default)
# AHEAD: `harness run --prepare-ahead` (default 16; 1 times the processes strictly one after another).
# Wall seconds go to $OUT/trial-cost.txt, the run as $OUT/trials-R.bundle. Needs MLX (source .whlB/setup.sh) and a
# git clone of the project as the working directory's repository.
set -uo pipefail
R=${1:?usage: trial_cost.sh TRIALS}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${WORK:-$HOME/trial-cost}
OUT=${OUT:-$WORK/out}
LIMIT=${LIMIT:-540}
AHEAD=${AHEAD:-16}
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled PYTHONPATH="$ROOT:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export HARNESS_CACHE=$WORK/cache-$R MLX_PTX_CACHE_DIR=$WORK/ptx-$R
mkdir -p "$WORK" "$OUT"
rm -rf "$WORK/r$R.db" "$MLX_PTX_CACHE_DIR" "$HARNESS_CACHE"
python3 "$ROOT/tools/benchmark_suite.py" --trials "$R" > "$WORK/bench-r$R.toml" || exit 1
harness() { python3 -c "from harness.cli.main import main; main()" "$@"; }
start=$(date +%s.%N)
timeout "$LIMIT" python3 -c "from harness.cli.main import main; main()" run --repo "$ROOT" \
  --suite "$WORK/bench-r$R.toml" --db "sqlite:///$WORK/r$R.db" --no-report --prepare-ahead "$AHEAD" \
  > "$WORK/r$R.log" 2>&1
status=$?
end=$(date +%s.%N)
tail -3 "$WORK/r$R.log"
python3 -c "print('trials=$R', 'ahead=$AHEAD', f'{$end - $start:.1f} s', 'exit', $status)" | tee -a "$OUT/trial-cost.txt"
harness export --db "sqlite:///$WORK/r$R.db" --out "$OUT/trials-$R.bundle" | tail -1
