#!/usr/bin/env bash
# session 15, call 3 (main 310c7ba + run.sh's AB_MODEL): call 2's final run had the 27B at 13.881 ms
# (87.6 %) against 13.683 (89.4 %) in session 14 - the folded-norm change (norm-loads) and the
# attention change (attn-qload) also run in the 27B. A/B on the 27B's step: each taken out again,
# 4 rounds; then the 35B-A3B's A/B once more with norm-loads out (the kept set's base again).
O=$OUT
OUT=$O/ab27 AB_MODEL=27b VARIANTS="no-norm-loads no-attn-qload" AB_REPEAT=4 \
  bash tests/gpu/run.sh ab > $O/ab27-stdout.txt 2>&1
grep -E "median of" $O/ab27/summary.txt $O/ab27-stdout.txt | tail -3
