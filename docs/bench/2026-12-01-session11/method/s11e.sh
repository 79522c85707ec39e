#!/usr/bin/env bash
# session 11, call 5 (diagnostic, outputs meaningless): what the GDN in-projection costs with its
# z rows (16.8 MB, a third of it) taken out: qkv|b|a-sized (8,256 rows) in 1,032 blocks (noz) or in
# one wave of 516 (noz1w); the same with the GDN decode step's blocks warming their head's z rows
# in L2 before their wait (zpf, zpf1w), i.e. the DRAM traffic of a GDN step that computes z itself
# from preloaded rows.
O=$OUT
OUT=$O/ab VARIANTS="noz noz1w zpf zpf1w" AB_REPEAT=3 bash tests/gpu/run.sh ab > $O/ab-stdout.txt 2>&1
cat $O/ab/summary.txt; grep -A12 "median of" $O/ab-stdout.txt | head -14
