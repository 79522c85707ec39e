#!/usr/bin/env bash
# session 14, call 5 (main 6b809d8): triggers moved later - gate_up lets down launch only after
# its selection (gu-late), the GDN step lets the out-projection launch only after its wait
# (gdn-late); 5 rounds. Then the block timeline of the step at 8,192 for main and for call 1's
# dn-shfirst (down's shared row loaded before the wait: +0.18 ms in calls 1 and 4), to see which
# launches take the extra time.
O=$OUT
OUT=$O/ab VARIANTS="gu-late gdn-late" AB_REPEAT=5 KEEP_MS=0.006 TEST_TIMEOUT=120 \
  VARIANT_TESTS="tests/cuda/test_engine.py" bash tests/gpu/run.sh ab 2>&1 | tee $O/ab-stdout.txt | grep -E "median of|pytest|variant"
OUT=$O/tl-base bash tests/gpu/run.sh timeline > $O/tl-base-stdout.txt 2>&1; tail -2 $O/tl-base/summary.txt
git apply .gpu/dn-shfirst.patch && OUT=$O/tl-dn-shfirst LAMPO_COMMIT="$LAMPO_COMMIT+dn-shfirst" bash tests/gpu/run.sh timeline > $O/tl-dn-shfirst-stdout.txt 2>&1
git apply -R .gpu/dn-shfirst.patch; tail -2 $O/tl-dn-shfirst/summary.txt
cd $O && tar czf all.tgz ab tl-base tl-dn-shfirst *.txt && rm -rf ab tl-base tl-dn-shfirst *.txt
