#!/usr/bin/env bash
# session 14, call 4 (main 6b809d8): does a kernel's trigger wait for its pre-wait loads? The next
# kernel let launch before the GEMVs' pre-wait loads (trig-gemv), before every decode kernel's
# (trig-all: GEMV, gate_up, GDN step, split-KV attention), and call 1's dn-shfirst again, with and
# without its trigger moved before its preload; 5 rounds; the engine tests on every variant faster
# than the base by >= 0.006 ms.
O=$OUT
OUT=$O/ab VARIANTS="trig-gemv trig-all dn-shfirst dn-shfirst-trig" AB_REPEAT=5 KEEP_MS=0.006 TEST_TIMEOUT=120 \
  VARIANT_TESTS="tests/cuda/test_engine.py" bash tests/gpu/run.sh ab 2>&1 | tee $O/ab-stdout.txt | grep -E "median of|pytest|variant"
