#!/usr/bin/env bash
# session 13, call 4 (branch s13 = main's engine): one shared-memory carveout for every decode
# kernel (cudaFuncAttributePreferredSharedMemoryCarveout 72 / 86 / 100 % of 228 KiB, so no SM
# changes its L1 / shared split between neighbouring kernels), 5 rounds.
O=$OUT
OUT=$O/ab VARIANTS="carve72 carve86 carve100" AB_REPEAT=5 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A8 "median of" $O/ab-stdout.txt | head -6
