#!/usr/bin/env bash
# session 14, call 1 (main 6b809d8): the top-k round by ballot (branch topk-ballot) and down's
# shared-expert row first, its first batch loaded before the wait; 5 rounds; the MoE op tests on
# each variant faster than the base by >= 0.005 ms.
O=$OUT
OUT=$O/ab VARIANTS="ballot dn-shfirst ballot+dn-shfirst" AB_REPEAT=5 KEEP_MS=0.005 TEST_TIMEOUT=100 \
  VARIANT_TESTS="tests/cuda/test_ops_gdn_moe.py" bash tests/gpu/run.sh ab 2>&1 | tee $O/ab-stdout.txt | grep -E "median of|pytest|variant"
