#!/usr/bin/env bash
# session 15, call 4 (main 9ea3d74 = 310c7ba's engine): the final real-prefill benches of both models
# again on a fresh machine (TESTS=0: the suite passed on this engine in call 2), to see how far the
# machine moves them (the 27B's step was 13.881 ms in call 2 against 13.683 in session 14 with the
# same 27B code apart from two changes call 3 measured as neutral on it).
O=$OUT
OUT=$O/final TESTS=0 bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
cat $O/final/summary.txt
grep -hE "copy bandwidth|^ +(1|8,192|65,536|262,008) " $O/final/bench/35b-a3b.txt $O/final/bench/27b.txt 2>/dev/null || tar xzf $O/final/results.tgz -O --wildcards '*35b-a3b.txt' '*27b.txt' | grep -E "copy bandwidth|^ +(1|8,192|65,536|262,008) "
