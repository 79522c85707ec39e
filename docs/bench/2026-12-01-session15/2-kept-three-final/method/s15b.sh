#!/usr/bin/env bash
# session 15, call 2 (main with gu-hpipe, norm-loads and attn-qload committed): each of the three
# taken out again (no-NAME: the reversed commit) and gate_up at GU_UNROLL = 4 (now that h_t comes
# with the weights), 5 rounds; then the final real-prefill benches of both models with TESTS=1
# (pytest -m cuda tests/cuda, the engine tests under LAMPO_DECODE_FUSION=none / all).
O=$OUT
OUT=$O/ab VARIANTS="no-gu-hpipe no-norm-loads no-attn-qload gu-u4" AB_REPEAT=5 \
  bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -E "median of" $O/ab/summary.txt
OUT=$O/final TESTS=1 bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
