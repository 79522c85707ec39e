#!/usr/bin/env bash
# next session, call 1 (run from a checkout of branch z-in-gdn): pytest -m cuda tests/cuda on the
# branch (TESTS=1, with the engine tests under LAMPO_DECODE_FUSION=none / all), and the branch's
# 35B-A3B step against main's native code (pre-z = main's native/ applied on the branch) and with the
# decode in-projection in its usual 1,032 blocks (z-2w), 5 rounds.
O=$OUT
OUT=$O/ab TESTS=1 VARIANTS="pre-z z-2w" AB_REPEAT=5 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/ab/summary.txt; grep -A3 "median of" $O/ab-stdout.txt | head -4
