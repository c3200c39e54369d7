#!/bin/bash
# Before/after of issue 37 on the example bundles: CODE_DIR is a harness checkout (e.g. a worktree of 151bd17, or
# this one), OUT a scratch folder; extra arguments go to each `harness import` (e.g. --repo /path/to/clone).
# usage: measure.sh CODE_DIR OUT [import options...]
code=$1; out=$2; shift 2
rm -rf $out; mkdir -p $out
ex=$(cd "$(dirname "$0")/../../.." && pwd)/reports/examples  # testkit.recorded.EXAMPLES
B="h200-62ac157 cpu-62ac157 h200-202d829 h200-2d82df7 cpu-cross-chip-ee285b2 h200-3c1c045 h200-planted-gpu-base h200-planted-gpu-head"
cd $out
H="env PYTHONPATH=$code ${PYTHON:-python} -m harness"
for b in $B; do $H import --db sqlite:///$out/r.db $ex/$b.bundle "$@" >/dev/null || echo "import failed $b"; done
echo "commit rows (repo, sha, runs):"
sqlite3 $out/r.db 'SELECT c.repo, substr(c.sha,1,10), (SELECT count(*) FROM run r WHERE r.commit_id=c.id) FROM "commit" c WHERE EXISTS (SELECT 1 FROM run r WHERE r.commit_id=c.id) ORDER BY c.repo, c.committed_at'
echo "commit rows in all: $(sqlite3 $out/r.db 'SELECT count(*), count(DISTINCT sha) FROM "commit"')"
/usr/bin/time -f "report %e s" $H report --db sqlite:///$out/r.db --out $out/site >/dev/null
echo "compare pages: $(ls $out/site | grep -c '^compare')"
f=$(ls $out/site/history-*nvidia-h200* 2>/dev/null | head -1)
echo "history page $f"
python3 - "$f" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
t = t[t.index('id="commits"'):]
print(" order:", " ".join(f"{sha[:8]}({when[5:10]})" for sha, when in re.findall(r'<code title="([0-9a-f]{40})">[0-9a-f]+</code></td><td>([^<]*)</td>', t)))
PY
grep -o "order not proven by ancestry" $f | head -1
python3 -c "import re,sys; t=open('$out/site/index.html').read(); i=t.find('Regression list'); print(re.sub('<[^>]+>','',t[i:i+300]).split(chr(10))[0][:160])"
