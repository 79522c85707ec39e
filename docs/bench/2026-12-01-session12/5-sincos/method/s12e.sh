#!/usr/bin/env bash
# session 12, call 5 (main, 87861cc = engine dc1c146): is RoPE's double-precision cos / sin (computed
# before the wait by split blocks that become resident only as the qkv GEMV drains) what makes ap1
# slow? ap1 against ap1 with a fast-math float sine / cosine (fastrope: a diagnostic, wrong for large
# angles) and main, 3 rounds.
O=$OUT
OUT=$O/ab VARIANTS="ap1 ap1+fastrope" AB_REPEAT=3 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A3 "median of" $O/ab-stdout.txt | head -6
