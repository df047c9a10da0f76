#!/usr/bin/env bash
# A GPU slot's work as device calls of at most 540 s each (a call may run 600 s; a slot is 15 minutes in all, of which
# machine start-up takes about 100 s and the kit's install about 25 s, so one call of 540 s and one of about 200 s).
# Most valuable first. Every step runs under its own time limit, cut to what is left of the call's BUDGET (seconds
# from the script's start, default 540), and must leave a result file newer than its start; a step with no time left
# is not started. At the end the script names every step whose result is missing and exits 1 (0: all written).
#   device calls, carrying .gpu (bash ../shared/gpu-kit/make.sh first); results in $OUT:
#     bash lab/speed/gpu_throughput.sh 1               # the capture probe, the sync check, capture against eager
#                                                       # for every method, eager-vs-captured loops, the main job
#     BUDGET=200 bash lab/speed/gpu_throughput.sh 2    # compute-bound: study throughput, then pilot shards
# Rehearse on the CPU (tiny versions of every step, from the checkout):
#     OUT=/tmp/out QUICK=1 bash lab/speed/gpu_throughput.sh 1; OUT=/tmp/out QUICK=1 bash lab/speed/gpu_throughput.sh 2
# Left out: AttendOut's remaining decisive runs (design B): the experiment runs on the CPU only, 401 steps of about
# 7 s, so no run finishes within a call.
set -uo pipefail
CALL=${1:-}
case "$CALL" in 1|2) ;; *) echo "usage: bash lab/speed/gpu_throughput.sh 1|2 (which device call)" >&2; exit 2;; esac
# QUICK: every limit x3 and a 1200-s budget (a loaded 2-core CPU starts python 3-5x slower than an idle one)
if [ -n "${QUICK:-}" ]; then SCALE=3; DEFAULT_BUDGET=1200; else SCALE=1; DEFAULT_BUDGET=540; fi
START=$(date +%s); BUDGET=${BUDGET:-$DEFAULT_BUDGET}; DEADLINE=$((START + BUDGET))
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
REPO=${REPO:-$(pwd)}; GLUE=${GLUE:-$REPO/../shared/data/glue}
if [ -z "${QUICK:-}" ] && [ -f .gpu/setup.sh ]; then source .gpu/setup.sh >/dev/null 2>&1; fi   # sets REPO, GLUE
if [ -n "${QUICK:-}" ]; then export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}; fi  # the checkout's code, not an install
WORK=$(mktemp -d /tmp/gpu-work.XXXXXX); cd "$WORK" || exit 2   # the checkout's folders must not shadow the installed package
exec > >(tee -a "$OUT/log_call$CALL.txt") 2>&1
MISSING=()

# step NAME LIMIT_S RESULT COMMAND...: run COMMAND under min(LIMIT_S, what is left), then check RESULT was written
step() {
  local name=$1 limit=$(($2 * SCALE)) result=$3; shift 3
  local left=$((DEADLINE - $(date +%s) - 5))
  echo; echo "=== $(date +%T) $name (limit ${limit} s, ${left} s left of ${BUDGET})"
  if [ "$left" -lt 10 ]; then MISSING+=("$name (not started: no time left of BUDGET=$BUDGET)"); return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  touch "$WORK/.stamp"; sleep 1   # a result must be newer than this
  timeout "$limit" "$@"; local rc=$?
  if [ -s "$result" ] && [ "$result" -nt "$WORK/.stamp" ]; then echo "--- $name: wrote $(basename "$result") (exit $rc)"
  else MISSING+=("$name (exit $rc$([ "$rc" = 124 ] && echo ": its ${limit} s ran out"), no $(basename "$result"))"); fi
}
# records.py RUNS_FOLDER JSON [START]: each record's config, status, wall time, timing, final scores and error as one
# JSON list (with the command's wall time since START, epoch seconds); no file where no run finished
cat > "$WORK/records.py" <<'PY'
import glob, json, sys, time
runs = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/*.json"))]
if not runs:
    sys.exit(f"no record in {sys.argv[1]}: nothing to write")  # a step that finished no run has no result
keep = ("config", "status", "wall_s", "timing", "final", "error")
out = {"records": [{k: r.get(k) for k in keep} for r in runs]}
if len(sys.argv) > 3:
    out["command_wall_s"] = time.time() - float(sys.argv[3])
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(len(runs), "records,", sum(r.get("status") == "ok" for r in runs), "ok", {k: v for k, v in out.items() if k != "records"})
PY

if [ -n "${QUICK:-}" ]; then   # the CPU rehearsal: the same steps, each tiny
  PROBE=cpu; DEV="--device cpu"; CAP="--device cpu --methods vanilla --steps 2"; LOOP="--steps 2 --device cpu --batch-size 4"
  BERT=minilm   # BERT-base's evaluation alone would take minutes on a loaded CPU
  MAIN="--methods vanilla --tasks rte --seeds 1 --max-train-samples 32 --epochs 1 --device cpu"
  TP="--tasks rte --seeds 1 --epochs 1 --max-train-samples 32 --workers 1"
  PILOT="--tasks rte --seeds 1 --epochs 1 --set train.max_train_samples=32 --workers 1 --device cpu"
else
  PROBE=cuda; DEV=""; CAP=""; LOOP="--steps 60"; BERT=bert-base
  MAIN="--methods vanilla,scores_dropout,uniform --tasks sst2,stsb,cola"
  TP="--tasks rte,mrpc,stsb,cola --seeds 4 --epochs 3 --workers auto"
  PILOT=""
fi

if [ "$CALL" = 1 ]; then
  step "device" 60 "$OUT/device.txt" bash -c "{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no GPU'; python3 -c 'import torch, transformers; print(\"torch\", torch.__version__, \"transformers\", transformers.__version__)'; } > '$OUT/device.txt'"
  step "capture probe: the grid's self-test, one tiny captured step" 60 "$OUT/probe.json" \
    python3 -c "import json, sys; from suite.grid.executors import workers; json.dump(workers.run_self_test(sys.argv[1]), open(sys.argv[2], 'w')); print(open(sys.argv[2]).read())" "$PROBE" "$OUT/probe.json"
  step "sync check: every method's step under torch.cuda.set_sync_debug_mode('error')" 90 "$OUT/sync.json" \
    python3 "$REPO/lab/speed/gpu_capture.py" --sync --data-dir "$GLUE" --out "$OUT/sync.json" $DEV
  step "capture against eager, every method (correctness), vanilla's dropout rate in replays" 150 "$OUT/capture.json" \
    python3 "$REPO/lab/speed/gpu_capture.py" --data-dir "$GLUE" --out "$OUT/capture.json" $CAP
  step "loop, eager against captured: MiniLM vanilla, RTE" 60 "$OUT/loop_minilm.json" \
    python3 -m suite bench --loop --tasks rte --methods vanilla --capture off,auto $LOOP --data-dir "$GLUE" --json "$OUT/loop_minilm.json"
  step "loop, eager against captured: BERT-base vanilla (MFU), RTE" 60 "$OUT/loop_bert.json" \
    python3 -m suite bench --loop --tasks rte --methods vanilla --model $BERT --capture off,auto $LOOP --data-dir "$GLUE" --json "$OUT/loop_bert.json"
  step "the README main job, --workers auto (target: 20 s)" 90 "$OUT/main.json" \
    bash -c "t0=\$(date +%s.%N); python3 -m suite run $MAIN --data-dir '$GLUE' --workers auto --out '$WORK/main' --quiet; python3 '$WORK/records.py' '$WORK/main/runs' '$OUT/main.json' \$t0"
  step "loop: AttendOut (eager by design), RTE" 40 "$OUT/loop_attendout.json" \
    python3 -m suite bench --loop --tasks rte --methods attendout --capture auto $LOOP --data-dir "$GLUE" --json "$OUT/loop_attendout.json"
else
  step "study throughput at the standard budget, captured, --workers auto: runs per GPU-hour" 150 "$OUT/throughput.json" \
    python3 "$REPO/lab/speed/study_throughput.py" --data-dir "$GLUE" $TP --capture auto --out "$OUT/throughput.json"
  step "pilot shards (studies/pilot-standard.yaml, --workers auto) until the call's time is spent" 540 "$OUT/pilot.json" \
    bash -c "t0=\$(date +%s.%N); timeout \$(( $DEADLINE - \$(date +%s) - 25 )) python3 -m suite run --study '$REPO/studies/pilot-standard.yaml' --data-dir '$GLUE' --workers auto --out '$OUT/pilot_standard' --quiet $PILOT; python3 '$WORK/records.py' '$OUT/pilot_standard/runs' '$OUT/pilot.json' \$t0"
fi

echo; echo "=== $(date +%T) call $CALL ended after $(( $(date +%s) - START )) s of BUDGET=$BUDGET"
if [ "${#MISSING[@]}" -gt 0 ]; then
  echo "MISSING results (${#MISSING[@]}):"; printf '  %s\n' "${MISSING[@]}"
  exit 1
fi
echo "every step wrote its result"
