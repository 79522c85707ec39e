#!/usr/bin/env bash
# session 13, call 8 (main 01cd3ba): gate_up's routed warps stopping the top-k after s + 1 rounds
# (slot s needs only the s-th expert; the warp that writes ids / weights still runs all k), 5
# rounds; the MoE op tests and the engine tests on it if it gains >= 0.008 ms.
O=$OUT
OUT=$O/ab VARIANTS="tkearly" AB_REPEAT=5 KEEP_MS=0.008 TEST_TIMEOUT=150 \
  VARIANT_TESTS="tests/cuda/test_ops_gdn_moe.py tests/cuda/test_engine.py" bash tests/gpu/run.sh ab 2>&1 | tee $O/ab-stdout.txt | grep -E "median of|pytest|variant"
