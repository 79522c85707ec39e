#!/usr/bin/env bash
# session 13, call 2 (branch s13): ab with TESTS=1 on the build whose gate_up loads the whole shared
# expert before its wait (base) against main's native code (noshpre) and the diagnostic without the top-k on top of it (diag-notopk4), 5 rounds.
O=$OUT
OUT=$O/ab TESTS=1 VARIANTS="noshpre diag-notopk4" AB_REPEAT=5 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A6 "median of" $O/ab-stdout.txt | head -8
