#!/usr/bin/env bash
# session 12, call 6 (main, d4d05bd = engine dc1c146): the GDN in-projection as 386 blocks of 4 rows
# per warp over the whole K (about 3 per SM, leaving registers for the GDN step's blocks to become
# resident and load their state before the wait) against main's 515 blocks of 3 rows, 3 rounds.
O=$OUT
OUT=$O/ab VARIANTS="inproj-r4" AB_REPEAT=3 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
grep -A2 "median of" $O/ab-stdout.txt | head -4
