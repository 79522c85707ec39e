#!/usr/bin/env bash
# session 13, call 1 (branch mailbox, 93faa3c): what one dependency point costs alone (handover
# probe); then ab with TESTS=1 on the mailbox build (base) against main's native code (nombox), the
# decode attention taking at least 128 keys per split (amin128), and the diagnostic without the
# top-k (diag-notopk3: experts fixed, outputs meaningless), 5 rounds.
O=$OUT
OUT=$O/handover bash tests/gpu/run.sh handover > $O/handover-stdout.txt 2>&1
OUT=$O/ab TESTS=1 VARIANTS="nombox amin128 diag-notopk3" AB_REPEAT=5 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/handover/summary.txt
grep -A6 "median of" $O/ab-stdout.txt | head -12
