#!/usr/bin/env bash
# session 15, call 1 (main after session 14): the eight compile-only branches of session 14, each
# found by reading the SASS of a decode kernel's path right after its wait (docs/decode-performance.md
# Round 14, "Prepared"): gu-hpipe (gate_up loads h_t with each weight batch), gemv-xpipe (one-token
# GEMV loads x with each weight batch), gdn-ticket (the GDN step's conv-state ticket by a thread with
# no stores in flight), norm-loads (the folded RMSNorm loads two groups per thread at once),
# combine-loads (the split-KV combine's loads no longer sunk past its barriers), gdn-loads (the GDN
# step's inputs all at once), topk-loads (the top-k's logit loads unpredicated, all at once),
# attn-qload (the split-KV attention issues its tiles, then all Q loads, before converting) - alone
# and all together, 5 rounds, no tests (a final run with TESTS=1 on whatever is kept follows).
O=$OUT
OUT=$O/ab VARIANTS="gu-hpipe gemv-xpipe gdn-ticket norm-loads combine-loads gdn-loads topk-loads attn-qload gu-hpipe+gemv-xpipe+gdn-ticket+norm-loads+combine-loads+gdn-loads+topk-loads+attn-qload" \
  AB_REPEAT=5 bash tests/gpu/run.sh ab 2>&1 | tee $O/ab-stdout.txt | grep -E "median of|pytest|variant"
