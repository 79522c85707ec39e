#!/usr/bin/env bash
# session 10, call 1: L2 warm-up sweep. Builds HEAD (base) and HEAD + pf.patch (knobs in LAMPO_X_PF),
# then ROUNDS interleaved rounds of the 35B-A3B step (depth 1 and 8,192, random fill) over the configs.
export LAMPO_COMMIT=${LAMPO_COMMIT:-e234260}
O=$OUT
OUT=$O/ab VARIANTS="pf" AB_REPEAT=1 bash tests/gpu/run.sh ab >/dev/null 2>&1
cat $O/ab/summary.txt
export PYTHONPATH=$PWD/.gpu/pylib
MOD=app/lampo/$(basename /tmp/lampo-gpu/build/_native*.so)
S=$O/sweep; mkdir -p $S
declare -A CFG=(
  [pf0]=""
  [rout]="router@out"
  [rout-shout]="router@out,shared@out"
  [rout-shr]="router@out,shared@router"
  [tgu8]="tail@gu=8"
  [tgu16]="tail@gu=16"
  [rout-tgu8]="router@out,tail@gu=8"
  [rout-tgu16]="router@out,tail@gu=16"
  [rout-tgu16-ef]="router@out,tail@gu=16,ef"
  [rout-tgu24-ef]="router@out,tail@gu=24,ef"
  [rout-tr8]="router@out,tail@router=8"
  [rout-tr16-ef]="router@out,tail@router=16,ef"
  [ef]="ef"
  [rout-hgu8]="router@out,head@gu=8"
  [rout-shr-tgu16-ef]="router@out,shared@router,tail@gu=16,ef"
)
bench1() {  # bench1 NAME ROUND
  timeout 60 python3 -m lampo.bench --preset qwen3.6-35b-a3b --random-weights --prompt 512 --depths 0,8192 \
    --fast-depth --profile-steps 0 --json $S/35b-a3b-$1-r$2.json > $S/35b-a3b-$1-r$2.txt 2>&1
}
for r in $(seq 1 ${ROUNDS:-3}); do
  cp /tmp/lampo-gpu/so/base.so $MOD
  LAMPO_COMMIT="$LAMPO_COMMIT" bench1 base $r
  cp /tmp/lampo-gpu/so/pf.so $MOD
  for name in "${!CFG[@]}"; do
    LAMPO_COMMIT="$LAMPO_COMMIT + pf.patch (LAMPO_X_PF=${CFG[$name]})" LAMPO_X_PF="${CFG[$name]}" bench1 "$name" $r
  done
  echo "round $r done $(date +%T)"
done
python3 tests/gpu/ab_summary.py $S | tee $S/ab-summary.txt
cp /tmp/lampo-gpu/so/pf.so $MOD
LAMPO_X_PF="router@out,shared@router,tail@gu=16,ef" timeout 200 python3 -m pytest -m cuda tests/cuda/test_engine.py -q -x \
  -p no:cacheprovider -k "logits or greedy or graph_replay" > $S/pytest-pf.log 2>&1
echo "pytest pf: $(tail -1 $S/pytest-pf.log)"
cp /tmp/lampo-gpu/so/base.so $MOD
cd $O && tar czf /tmp/sweep.tgz sweep && rm -rf sweep && mv /tmp/sweep.tgz $O/
