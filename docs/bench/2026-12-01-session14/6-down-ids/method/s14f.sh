#!/usr/bin/env bash
# session 14, call 6 (main 6b809d8): the down launch loads the k expert ids and weights once per
# token (lane j holds slot j's) and takes each item's by a shuffle, its (slot, chunk) stepped
# without a division, and builds every batch straight-line: the SASS of main has, per item, an
# integer division and an id load that its weight load waits for (dn-ids; same values, same
# summation order); 5 rounds; the whole GPU suite on it if faster by >= 0.006 ms.
O=$OUT
OUT=$O/ab VARIANTS="dn-ids" AB_REPEAT=5 KEEP_MS=0.006 TEST_TIMEOUT=200 \
  VARIANT_TESTS="tests/cuda" bash tests/gpu/run.sh ab 2>&1 | tee $O/ab-stdout.txt | grep -E "median of|pytest|variant"
