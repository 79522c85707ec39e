#!/usr/bin/env bash
# session 15, call 6 (main's engine = 310c7ba's): long prompts as a user pastes them. The build and
# the two step benches of `run.sh final` with no full-size model (FINAL_MODELS=none), then with that
# build: the 27B's prefill of 65,536 and 262,000 tokens and decode at 65,536 (last measured at
# c83f301), and the 35B-A3B's prefill of a 262,000-token prompt (TTFT of a whole-book paste).
O=$OUT
OUT=$O/final TESTS=0 FINAL_MODELS=none bash tests/gpu/run.sh final > $O/final-stdout.txt 2>&1
export PYTHONPATH=$(pwd)/.gpu/pylib:/tmp/lampo-gpu/py
mkdir -p $O/bench
timeout 150 python3 -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 262000 --depths 0 \
  --profile-steps 0 --json $O/bench/35b-a3b-long.json > $O/bench/35b-a3b-long.txt 2>&1; echo "35b-a3b exit $?"
timeout 300 python3 -m lampo.bench --preset qwen3.6-27b --random-weights --prompt 65536,262000 --depths 65536 \
  --profile-steps 0 --json $O/bench/27b-long.json > $O/bench/27b-long.txt 2>&1; echo "27b exit $?"
cat $O/final/summary.txt $O/bench/35b-a3b-long.txt $O/bench/27b-long.txt
