#!/usr/bin/env bash
# The whole GPU lease of the throughput issue as one script (about 9 minutes on an H100 or H200), most valuable step
# first, each under its own time limit so a failure leaves the rest. Before/after in one sitting: every comparison
# runs eager (train.capture=off: the code path of e3bf53b) and captured in the same call.
#   device run, carrying .gpu (bash ../shared/gpu-kit/make.sh first):
#     bash benchmarks/gpu_throughput.sh            # writes $OUT/*.json and $OUT/log.txt
# Rehearse on the CPU:  OUT=/tmp/out QUICK=1 bash benchmarks/gpu_throughput.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -f .gpu/setup.sh ] && [ -z "${QUICK:-}" ]; then source .gpu/setup.sh >/dev/null 2>&1; fi
REPO=${REPO:-$(pwd)}; GLUE=${GLUE:-$REPO/../shared/data/glue}
cd /tmp && mkdir -p work && cd work   # the checkout's folders must not shadow the installed package
exec > >(tee -a "$OUT/log.txt") 2>&1
step() { echo; echo "=== $(date +%T) $1"; }
if [ -n "${QUICK:-}" ]; then   # the CPU rehearsal: tiny versions of every step
  CAP="--device cpu --methods vanilla,drophead"; LOOP="--steps 4 --device cpu"; TP="--tasks rte --seeds 1 --epochs 1 --max-train-samples 64 --workers 1"; TP_EAGER="$TP"
  SST="--set train.max_train_samples=64 --epochs 1"; MAIN="--set train.max_train_samples=64 --epochs 1 --seeds 1"
else
  CAP=""; LOOP="--steps 60"; TP="--tasks rte,mrpc,stsb,cola --seeds 4 --epochs 3 --workers 1,auto"; TP_EAGER="--tasks rte,mrpc,stsb,cola --seeds 4 --epochs 3 --workers auto"
  SST="--preset paper --model minilm"; MAIN=""
fi
step "device"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
step "1. every method captured against eager (correctness), vanilla's dropout rate under replay"
timeout 200 python3 "$REPO/benchmarks/gpu_capture.py" --data-dir "$GLUE" --out "$OUT/capture.json" $CAP
step "2. the loop, eager against captured: MiniLM vanilla, AttendOut (eager), BERT-base vanilla (MFU), RTE"
timeout 60 python3 -m suite bench --loop --tasks rte --methods vanilla --capture off,auto $LOOP --data-dir "$GLUE" --json "$OUT/loop_minilm.json"
timeout 40 python3 -m suite bench --loop --tasks rte --methods attendout --capture auto $LOOP --data-dir "$GLUE" --json "$OUT/loop_attendout.json"
timeout 60 python3 -m suite bench --loop --tasks rte --methods vanilla --model bert-base --capture off,auto $LOOP --data-dir "$GLUE" --json "$OUT/loop_bert.json"
step "3. study throughput at the standard budget: runs per GPU-hour against the runs packed, eager and captured"
timeout 200 python3 "$REPO/benchmarks/study_throughput.py" --data-dir "$GLUE" $TP --capture auto --out "$OUT/throughput.json"
timeout 120 python3 "$REPO/benchmarks/study_throughput.py" --data-dir "$GLUE" $TP_EAGER --capture off --out "$OUT/throughput_eager.json"
step "4. one SST-2 run on the full training set, captured"
timeout 90 python3 -m suite run --methods vanilla --tasks sst2 --seeds 1 --data-dir "$GLUE" --out /tmp/sst2 $SST
python3 -c "import json,glob; r=[json.load(open(f)) for f in glob.glob('/tmp/sst2/runs/*.json')]; json.dump([{k: x.get(k) for k in ('status','wall_s','timing','final','error')} for x in r], open('$OUT/sst2.json','w'), indent=1)"
step "5. the README main job, --workers auto"
/usr/bin/time -v timeout 90 python3 -m suite run --methods vanilla,scores_dropout,uniform --tasks sst2,stsb,cola --data-dir "$GLUE" --workers auto --out /tmp/main $MAIN 2>&1 | grep -E "done,|Elapsed|Maximum resident|\|"
step "done"
