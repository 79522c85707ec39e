#!/usr/bin/env bash
# session 10, call 2: the queued decode (decode_submit / decode_collect): engine tests + the host-gap probe
O=$OUT
OUT=$O/ab AB_REPEAT=1 bash tests/gpu/run.sh ab >/dev/null 2>&1
cat $O/ab/summary.txt
export PYTHONPATH=$PWD/.gpu/pylib
timeout 240 python3 -m pytest -m cuda tests/cuda/test_engine.py -q -rs -p no:cacheprovider > $O/pytest-engine.log 2>&1
echo "pytest engine: $(tail -1 $O/pytest-engine.log)"
grep -E "FAILED|Error" $O/pytest-engine.log | head -20
timeout 240 python3 .gpu/queue_probe.py $O/queue-probe.json > $O/queue-probe.txt 2>&1
echo "probe exit $?"; grep -E "median|Error|error" $O/queue-probe.txt | head -20
