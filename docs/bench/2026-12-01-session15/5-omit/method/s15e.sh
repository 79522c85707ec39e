#!/usr/bin/env bash
# session 15, call 5 (main 9ea3d74's engine): the graphed 35B-A3B step's in-graph cost per op family
# (run.sh omit: the step without each family in turn), to refresh the routed experts' stream rate
# quoted in the README (last measured at bbd0375, session 6: 0.889 ms for 2.26 GB, 2.5 TB/s).
O=$OUT
OUT=$O/omit bash tests/gpu/run.sh omit > $O/omit-stdout.txt 2>&1
cat $O/omit/summary.txt; cat $O/omit/bench/omit-summary.txt 2>/dev/null || tar xzf $O/omit/results.tgz -O --wildcards '*omit-summary.txt'
