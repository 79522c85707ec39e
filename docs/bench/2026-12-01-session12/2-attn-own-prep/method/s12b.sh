#!/usr/bin/env bash
# session 12, call 2 (branch attn-own-prep): pytest -m cuda tests/cuda on the branch (TESTS=1, with
# the engine tests under LAMPO_DECODE_FUSION=none / all), and its 35B-A3B step against main's native
# code (pre-ap) and with the attention qkv GEMV in one wave of 384 blocks (qkv-r3), 5 rounds.
O=$OUT
OUT=$O/ab TESTS=1 VARIANTS="pre-ap qkv-r3" AB_REPEAT=5 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/ab/summary.txt; grep -A3 "median of" $O/ab-stdout.txt | head -6
