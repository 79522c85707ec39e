#!/usr/bin/env bash
# session 14, call 3 (main 6b809d8): the split-KV combine with one barrier (every warp finds M and l
# itself), the LM head folding the final norm in (one launch fewer), down's items shared row first
# without any preload (a diagnostic for call 1's dn-shfirst), and the embedding triggering first
# (a diagnostic: no pass boundary); 5 rounds; op + engine tests on every variant faster by >= 0.004 ms.
O=$OUT
OUT=$O/ab VARIANTS="comb1s lmh-normed dn-order emb-trig" AB_REPEAT=5 KEEP_MS=0.004 TEST_TIMEOUT=120 \
  VARIANT_TESTS="tests/cuda/test_ops_core.py tests/cuda/test_engine.py" bash tests/gpu/run.sh ab 2>&1 | tee $O/ab-stdout.txt | grep -E "median of|pytest|variant"
