#!/usr/bin/env bash
# session 11, call 4: the final code under pytest -m cuda tests/cuda (and the engine tests with
# LAMPO_DECODE_FUSION=none / all), then the final benches (every depth by real prefill)
O=$OUT
OUT=$O/final TESTS=1 bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
