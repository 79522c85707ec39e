#!/usr/bin/env bash
# session 11, call 6: one-wave GEMV shape (3 rows per warp, whole K) for one token where the usual
# shape needs 1.x waves (the 35B-A3B GDN in-projection: 515 blocks instead of 772), against the
# shape before it (pre); then the GEMV and engine tests on it.
O=$OUT
OUT=$O/ab VARIANTS="pre" AB_REPEAT=3 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A3 "median of" $O/ab-stdout.txt | head -4
export PYTHONPATH=$PWD/.gpu/pylib
timeout 120 python3 -m pytest -m cuda tests/cuda/test_ops_core.py::test_gemv tests/cuda/test_ops_core.py::test_gemv_normed_is_rmsnorm_then_gemv \
  tests/cuda/test_ops_core.py::test_gemv_add_residual_is_gemv_then_add tests/cuda/test_engine.py -q -rs -p no:cacheprovider > $O/pytest.log 2>&1
echo "gemv + engine tests: $(tail -1 $O/pytest.log)"; grep -E "^FAILED" $O/pytest.log | head
