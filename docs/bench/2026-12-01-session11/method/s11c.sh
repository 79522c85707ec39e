#!/usr/bin/env bash
# session 11, call 3: on f7b48ee, the decode split holding the new key also loads its older keys
# before the PDL wait (tail-old); tail-old-s2: the same with splits of at least 2 tiles. Attention
# op tests on every faster variant, engine tests on the fastest; then the base on the timeline.
O=$OUT
OUT=$O/ab VARIANTS="tail-old tail-old-s2" AB_REPEAT=5 VARIANT_TESTS="tests/cuda/test_ops_core.py -k attn" \
  KEEP_MS=0.005 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/ab/summary.txt; grep -A12 "median of" $O/ab-stdout.txt | head -14
best=$(grep -A12 "median of" $O/ab-stdout.txt | python3 -c '
import re, sys
rows = [(float(m.group(2)), m.group(1)) for l in sys.stdin
        if (m := re.match(r"(\S+) \(median of \d+\):.*depth 8,192: ([\d.]+) ms", l))]
base = dict((n, v) for v, n in rows).get("base", 1e9)
v, n = min(rows)
print(n if n != "base" and v < base - 0.005 else "")')
echo "fastest variant at 8,192: ${best:-none}"
if [ -n "$best" ]; then
  export PYTHONPATH=$PWD/.gpu/pylib
  MOD=$(ls app/lampo/_native*.so)
  cp $MOD /tmp/base.so && cp /tmp/lampo-gpu/so/$best.so $MOD
  timeout 150 python3 -m pytest -m cuda tests/cuda/test_engine.py -q -rs -p no:cacheprovider > $O/pytest-engine-$best.log 2>&1
  echo "engine tests ($best): $(tail -1 $O/pytest-engine-$best.log)"; grep -E "^FAILED" $O/pytest-engine-$best.log | head
  cp /tmp/base.so $MOD
fi
OUT=$O/tl bash tests/gpu/run.sh timeline > $O/tl-stdout.txt 2>&1
grep -B2 -A30 "per launch name" $O/tl-stdout.txt | head -45
