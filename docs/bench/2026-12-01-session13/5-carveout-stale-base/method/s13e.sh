#!/usr/bin/env bash
# session 13, call 5 (branch s13 = main's engine): one shared-memory carveout for every decode
# kernel (carveL1: the kernels without shared memory ask for the largest L1; carve72 again: 72 % of 228 KiB for all, so no SM
# changes its L1 / shared split between neighbouring kernels), 5 rounds.
O=$OUT
OUT=$O/ab VARIANTS="carveL1 carve72" AB_REPEAT=5 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A8 "median of" $O/ab-stdout.txt | head -6
