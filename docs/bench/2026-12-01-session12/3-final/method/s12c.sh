#!/usr/bin/env bash
# session 12, call 3 (main, dc1c146): the final real-prefill benches with TESTS=1 (pytest -m cuda
# tests/cuda, the engine tests under LAMPO_DECODE_FUSION=none / all), then the decode attention doing
# attn_prep's work itself with its raw rows loaded first (ap2, branch attn-own-prep 2nd commit) and
# as first measured (ap1) against main, 3 rounds.
O=$OUT
OUT=$O/final TESTS=1 bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
OUT=$O/ab VARIANTS="ap2 ap1" AB_REPEAT=3 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/ab/summary.txt | tail -4; grep -A3 "median of" $O/ab-stdout.txt | head -6
