#!/usr/bin/env bash
# session 12, call 4 (main, 87861cc = engine dc1c146): the graphed 35B-A3B step at 8,192 on the
# timeline, for main and with ap1 (the decode attention doing attn_prep's work), to see which
# launches' share of the critical path moves.
O=$OUT
OUT=$O/tl-main bash tests/gpu/run.sh timeline > $O/tl-main-stdout.txt 2>&1
git apply .gpu/ap1.patch && OUT=$O/tl-ap1 LAMPO_COMMIT="$LAMPO_COMMIT + ap1" bash tests/gpu/run.sh timeline > $O/tl-ap1-stdout.txt 2>&1
git apply -R .gpu/ap1.patch
for m in main ap1; do echo "== $m"; tail -3 $O/tl-$m/summary.txt; done
