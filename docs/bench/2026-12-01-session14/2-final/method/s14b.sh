#!/usr/bin/env bash
# session 14, call 2 (main 6b809d8, engine of ab27ec0): the final real-prefill benches with TESTS=1
# (pytest -m cuda tests/cuda, the engine tests under LAMPO_DECODE_FUSION=none / all).
O=$OUT
OUT=$O/final TESTS=1 bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
