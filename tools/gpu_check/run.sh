#!/usr/bin/env bash
# Chorus's GPU check: one GPU, offline. From the project root on the GPU box:   make gpu-check
#   (= WHEELS=.gpu/whl bash tools/gpu_check/run.sh; WHEELS: cp312 wheels of what the image lacks, see README.md)
# Dry run on a CPU machine (project venv, accelerator=cpu, short budgets):   make gpu-check-dry
# Every step has its own timeout; a failed step is logged and the next one runs. At most TOTAL_S (420)
# seconds in all: a session's 15 minutes of device time hold a machine's start, one run and a rerun.
# The most important figures first: bench/gpu.py's conformer_gpu.yaml row (g1) right after the corpus.
# As each step ends its summary line (summarize.py) is added to $OUT/summary.txt and printed, and its
# figures are in $OUT (bench/gpu.py's JSON after every recipe), so a run cut off still returns them.
# Logs: $OUT/logs/ while running, then $OUT/gpu_logs.tar.gz; $OUT/summary.txt whole at the end.
set -u
T0=$(date +%s)
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WHEELS=${WHEELS:-.gpu/whl}                  # never committed: copied beside the checkout (tools/gpu_check/README.md)
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then TOTAL=${TOTAL_S:-900}; else TOTAL=${TOTAL_S:-420}; fi
DEADLINE=$((T0 + TOTAL))
RESERVE=30                                  # seconds kept for the last summary line, stopping Ray, packing the logs
OUT=${OUT:-/tmp/chorus-kit-out}
LOGS=$OUT/logs
W=${WORK_DIR:-/tmp/ck$$}                   # scratch: short (Ray's socket paths live under it)
P=$W/project
CORPUS=$W/tiny                              # the corpus step b synthesizes
rm -rf "$LOGS" "$OUT/summary.txt" "$OUT"/gpu*.json "$OUT"/gpu*.png   # an earlier run's, in a reused OUT
mkdir -p "$LOGS" "$W/runs"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
export RAY_TMPDIR=$W                        # a Ray that bench/gpu.py starts lives (and is cleaned up) in the scratch
G_REPEATS=${G_REPEATS:-5}                             # bench/gpu.py: interleaved repeats of every contender
G_BASELINE=${G_BASELINE:-auto}                        # its baseline: auto (Ray Train where ray.train imports) or torch
if [ "$DRY" = 1 ]; then
  PY=${PY:-.venv/bin/python}; CPUS=${CPUS:-2}; GPUS=0; ACC=cpu; STORE_MB=500
  SYNTH_UTT=${SYNTH_UTT:-300}; D_WALL=${D_WALL:-20}; F_WALL=${F_WALL:-15}; H_WALL=${H_WALL:-15}
  GPU_CPL=1; CPU_CPL=2; H_CPL=1; PROBE_STEPS=3
  G_WINDOW=${G_WINDOW:-1}; G2_WINDOW=${G2_WINDOW:-1}; G1_CAP=400; G2_CAP=400
  # bench/gpu.py on the CPU: every part's code, on a model and batches a CPU steps in well under a second
  G_ARGS=(--device cpu --workers 1 --steps 1 --batch-seconds 20 --set model.d_model=32 --set model.hidden=32
          --set model.layers=1 --set model.heads=2 --set model.ffn_dim=64 --set model.subsample_channels=8
          --set data.max_batch_seconds=20 --sizes 1)
else
  PY=${PY:-python3}; CPUS=${CPUS:-16}; GPUS=1; ACC=gpu; STORE_MB=4000
  SYNTH_UTT=${SYNTH_UTT:-1000}; D_WALL=${D_WALL:-20}; F_WALL=${F_WALL:-20}; H_WALL=${H_WALL:-20}
  GPU_CPL=8; CPU_CPL=16; H_CPL=8; PROBE_STEPS=10
  G_WINDOW=${G_WINDOW:-3}; G2_WINDOW=${G2_WINDOW:-2}; G1_CAP=150; G2_CAP=240  # seconds a window; step limits
  G_ARGS=(--workers $((CPUS / 2 - 1)) --steps 5)
fi
G_ARGS+=(--repeats "$G_REPEATS" --baseline "$G_BASELINE" --corpus "$CORPUS")
TRAIN_OVERHEAD=${TRAIN_OVERHEAD:-40}       # a job's start (actor, torch, CUDA) and final test evaluations, beyond its wall budget
echo -e "step\trc\tstart\tend\tnote" > "$LOGS/steps.tsv"
BG_PIDS=()
HEAD_DIRS=()
TRAIN_ENV=()

log() { echo "[run.sh $(( $(date +%s) - T0 ))s] $*" | tee -a "$LOGS/run.log"; }

# summarize_step NAME: the step's summary line, added to $OUT/summary.txt as the step ends, and printed
summarize_step() {
  local text; text=$(timeout 20 "$PY" "$KIT/summarize.py" "$OUT" --step "$1" 2>> "$LOGS/summarize.err") \
    || text="$1	rc=?	0.0s	{\"summarize_failed\": \"see logs/summarize.err\"}"
  echo "$text" >> "$OUT/summary.txt"
  log "summary: $text"
}

# row NAME RC START END NOTE: a line in steps.tsv, then the step's summary line
row() { echo -e "$1\t$2\t$3\t$4\t$5" >> "$LOGS/steps.tsv"; summarize_step "$1"; }

# run_step NAME TIMEOUT CMD...: CMD under `timeout`, capped to what is left before the deadline;
# its stdout+stderr in logs/NAME.log; a line in steps.tsv whatever happens, and the step's summary line
# (SUMMARY_LATER=1: the caller summarizes, once it has copied the step's files).
run_step() {
  local name=$1 t=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) - RESERVE - 10 ))
  if (( left < 10 )); then skip_step "$name" "no time left"; return 0; fi
  (( t > left )) && t=$left
  local s; s=$(date +%s.%N)
  { echo "=== $name: $* (timeout ${t}s, cwd $(pwd))"; } >> "$LOGS/$name.log"
  # in the background and waited for: a TERM to this script is handled at once (the trap stops the step)
  timeout -k 10 "$t" "$@" >> "$LOGS/$name.log" 2>&1 < /dev/null &
  STEP_PID=$! STEP_NAME=$name STEP_START=$s
  log "$name: start (timeout ${t}s): $*"
  wait "$STEP_PID"
  local rc=$?
  STEP_PID=""
  echo -e "$name\t$rc\t$s\t$(date +%s.%N)\t${NOTE:-}" >> "$LOGS/steps.tsv"
  log "$name: rc $rc after $(( $(date +%s) - ${s%.*} ))s"
  [ "${SUMMARY_LATER:-0}" = 1 ] || summarize_step "$name"
  return 0
}

skip_step() { log "$1: skipped: $2"; row "$1" skip "$(date +%s.%N)" "$(date +%s.%N)" "$2"; }

finish() {
  trap - EXIT TERM INT
  log "finishing"
  for d in ${HEAD_DIRS[@]+"${HEAD_DIRS[@]}"}; do stop_head "$d"; done
  for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do kill "$pid" 2>/dev/null; done
  timeout 20 "$PY" "$KIT/rayhead.py" reap "$W" >> "$LOGS/ray_heads.log" 2>&1
  cp -r "$W/ray-logs" "$LOGS/" 2>/dev/null
  # the warnings and errors of every process (learner actors log to Ray's files, not to the console)
  grep -rhE "Warning|WARNING|Error|ERROR|Traceback|Exception|cudnn|cuDNN|CUDA|not part of single contiguous" "$LOGS" \
    --include='*.log' --include='*.err' --include='*.out' 2>/dev/null \
    | grep -vE "^=== |^\[run.sh|runtime_env_agent.py|state-dump|errored: 0|RAY_ERROR_INFO_CHANNEL|plasma error: 0|^(torch|gpu|python)=|utils.py:[0-9]+ -- Module ray.dashboard" \
    | sed -E 's/^[0-9-]+ [0-9:,]+\s+//' | sort | uniq -c | sort -rn | head -300 > "$LOGS/warnings_and_errors.txt"
  # the whole summary, headline first, in place of the lines added step by step (kept if this fails)
  timeout 20 "$PY" "$KIT/summarize.py" "$OUT" > "$OUT/summary.whole" 2>> "$LOGS/summarize.err" \
    && mv "$OUT/summary.whole" "$OUT/summary.txt" || rm -f "$OUT/summary.whole"
  echo -e "total_s\t{\"seconds\": $(( $(date +%s) - T0 )), \"limit_s\": $TOTAL}" >> "$OUT/summary.txt"
  cp "$OUT/summary.txt" "$LOGS/"
  echo "=== $OUT/summary.txt"; cat "$OUT/summary.txt"
  { tar -czf "$OUT/gpu_logs.tar.gz" -C "$OUT" logs \
    || "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1], 'w:gz').add(sys.argv[2], 'logs')" "$OUT/gpu_logs.tar.gz" "$LOGS"; } \
    && rm -rf "$LOGS"
  rm -rf "$W"
  exit 0
}
trap finish EXIT
STEP_PID=""
on_signal() {  # the step running is stopped, and has its row and summary line like any other
  log "signal: stopping"
  if [ -n "$STEP_PID" ]; then
    kill -TERM "$STEP_PID" 2>/dev/null; wait "$STEP_PID"
    echo -e "$STEP_NAME\t$?\t$STEP_START\t$(date +%s.%N)\tstopped by a signal" >> "$LOGS/steps.tsv"
    summarize_step "$STEP_NAME"
  fi
  exit 143
}
trap on_signal TERM INT

HEAD_ADDR=""
HEAD_WHY=""
start_head() {  # start_head NAME DIR GPUS [ENV...]: sets HEAD_ADDR ("" on failure, HEAD_WHY says why)
  local name=$1 dir=$2 gpus=$3; shift 3
  HEAD_ADDR=""
  if (( DEADLINE - $(date +%s) - RESERVE - 10 - TRAIN_OVERHEAD < 10 )); then
    HEAD_WHY="no time left for a job"; skip_step "$name" "$HEAD_WHY"; return 0
  fi
  NOTE="gpus=$gpus" run_step "$name" 120 env "$@" "$PY" "$KIT/rayhead.py" start "$dir" --cpus "$CPUS" --gpus "$gpus" \
    --object-store-mb "$STORE_MB"
  HEAD_ADDR=$(grep -oE '^127\.0\.0\.1:[0-9]+$' "$LOGS/$name.log" | tail -1)
  # stopped at the end even when its start failed or was cut off: its GCS port is in the command it logged
  local port; port=$(grep -oE -- '--port [0-9]+' "$LOGS/$name.log" | tail -1 | cut -d' ' -f2)
  [ -n "$port" ] && HEAD_DIRS+=("$dir|$port")
  HEAD_WHY="no Ray head (see $name)"
  log "$name: address '${HEAD_ADDR}'"
}
stop_head() {  # stop_head "DIR|PORT"
  local dir=${1%%|*} port=${1##*|}
  [ -d "$dir" ] || return 0
  timeout 60 "$PY" "$KIT/rayhead.py" stop "$dir" "$port" >> "$LOGS/ray_heads.log" 2>&1
  mkdir -p "$W/ray-logs"; mv "$dir-logs" "$W/ray-logs/$(basename "$dir")" 2>/dev/null
  local kept=()
  for d in ${HEAD_DIRS[@]+"${HEAD_DIRS[@]}"}; do [ "$d" != "$1" ] && kept+=("$d"); done
  HEAD_DIRS=(${kept[@]+"${kept[@]}"})
}

# train NAME ADDRESS WALL SPEC SETTINGS...: one `chorus train` job; keeps its console, summary and curves
train() {
  local name=$1 addr=$2 wall=$3 spec=$4; shift 4
  local left=$(( DEADLINE - $(date +%s) - RESERVE - 10 - TRAIN_OVERHEAD ))
  if (( left < wall )); then wall=$left; fi
  if (( wall < 10 )); then skip_step "$name" "no time left for a wall budget"; return 0; fi
  local args=(-m orchestrator.cli train "$spec" --out "$W/runs/$name" --overwrite --set "budget.wall_seconds=$wall"
              --set data.test_unseen_engine=null --set "data.train=$CORPUS/train.jsonl" --set "data.dev=$CORPUS/dev.jsonl"
              --set "data.test=$CORPUS/test.jsonl" --set "data.test_unseen=$CORPUS/test-unseen.jsonl" "$@")
  [ -n "$addr" ] && args+=(--address "$addr")
  NOTE="wall=$wall" SUMMARY_LATER=1 run_step "$name" $(( wall + TRAIN_OVERHEAD )) \
    env ${TRAIN_ENV[@]+"${TRAIN_ENV[@]}"} "$PY" "${args[@]}"
  mkdir -p "$LOGS/$name"
  for f in summary.json evals.jsonl events.jsonl; do cp "$W/runs/$name/$f" "$LOGS/$name/" 2>/dev/null; done
  [ "$(tail -1 "$LOGS/steps.tsv" | cut -f1,2)" != "$name	skip" ] && summarize_step "$name"
}

# ---- set-up: the project at a scratch path, the kit's wheels
if [ -d "$KIT/project" ]; then cp -r "$KIT/project" "$P" && cd "$P" || { log "no project copy"; exit 1; }
else P=${PROJECT:-$PWD}; cd "$P" || exit 1; [ -d orchestrator ] || { log "run from the project root (no orchestrator/ here)"; exit 1; }; fi
if [ "$DRY" = 1 ]; then
  export PYTHONPATH=${DRY_SITE:+$DRY_SITE:}$P
  row install 0 "$T0" "$(date +%s)" "dry: the venv's packages${DRY_SITE:+ + $DRY_SITE}"
elif [ "${SKIP_INSTALL:-0}" = 1 ]; then  # tests of this script only: PY's own packages
  export PYTHONPATH=$P
else
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || log "no wheels in WHEELS=$WHEELS: the install step will fail"
  run_step install 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$W/site" "$WHEELS"/*.whl
  export PYTHONPATH=$W/site:$P
fi
log "PY=$PY PYTHONPATH=$PYTHONPATH DRY=$DRY"

# ---- a. the machine, versions, imports
[ "$DRY" != 1 ] && { run_step a_nvidia_smi 30 nvidia-smi; nvidia-smi -L >> "$LOGS/a_nvidia_smi.log" 2>&1; }
run_step a_sys 20 bash -c 'uname -a; nproc; free -g; df -h /dev/shm /tmp; ulimit -n; cat /proc/cpuinfo | grep -m1 "model name"'
run_step a_env 90 "$PY" "$KIT/envcheck.py"

# ---- b. the corpus (espeak-ng only without Festival)
# in the scratch folder: a checkout's own data/tiny (the demo's corpus) is never touched
NOTE="utterances=$SYNTH_UTT" run_step b_synth 120 "$PY" -m orchestrator.cli synth "$CORPUS" --utterances "$SYNTH_UTT" --seed 0 --workers "$CPUS"
ls -la "$CORPUS" >> "$LOGS/b_synth.log" 2>&1

# ---- c. GPU and CPU monitors for the whole run
if [ "$DRY" != 1 ]; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm --format=csv -l 1 \
    > "$LOGS/gpu_util.csv" 2>&1 & BG_PIDS+=($!)
  nvidia-smi dmon -s um -d 1 -o DT > "$LOGS/dmon.log" 2>&1 & BG_PIDS+=($!)
  ( while true; do
      echo "--- $(date +%s) $(date +%T)"
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>&1 | while IFS=, read -r pid mem; do
        echo "$pid,$mem,$(ps -o args= -p "$pid" 2>/dev/null | cut -c1-120)"; done
      sleep 3
    done ) > "$LOGS/gpu_procs.log" 2>&1 & BG_PIDS+=($!)
fi
vmstat -t 2 > "$LOGS/vmstat.log" 2>&1 & BG_PIDS+=($!)
row c_monitors 0 "$(date +%s)" "$(date +%s)" "${#BG_PIDS[@]} monitors"

# ---- g1 (first: what the check is for). bench/gpu.py's conformer_gpu.yaml row: samples/s, GPU busy and
# data wait of one learner, two sharing the GPU and the DataLoader baseline, interleaved windows
NOTE="conformer_gpu.yaml" run_step g1_conformer_gpu "$G1_CAP" "$PY" bench/gpu.py "${G_ARGS[@]}" --window "$G_WINDOW" \
  --parts learners --recipes conformer_gpu --out "$OUT/gpu_conformer_gpu.json"
SUMMARY_HEAD=$(timeout 20 "$PY" "$KIT/summarize.py" "$OUT" --headline 2>> "$LOGS/summarize.err") \
  && { echo "$SUMMARY_HEAD" >> "$OUT/summary.txt"; log "summary: $SUMMARY_HEAD"; }

# ---- i. cuDNN's LSTM vs the learner's flat parameters (a compaction warning on the GPU fails it)
run_step i_lstm_probe 60 "$PY" "$KIT/lstm_probe.py" "$CORPUS" --steps "$PROBE_STEPS"

# ---- g2. bench/gpu.py's other parts: a learner's step at 320 s batches (fp32, bf16), then the learners
# row of tiny.yaml and conformer.yaml's models; g1's row merged in: $OUT/gpu.json is the whole result
MERGE=(); [ -f "$OUT/gpu_conformer_gpu.json" ] && MERGE=(--merge "$OUT/gpu_conformer_gpu.json")
NOTE="tiny,conformer + steps" run_step g2_bench_gpu "$G2_CAP" "$PY" bench/gpu.py "${G_ARGS[@]}" --window "$G2_WINDOW" \
  --parts steps,learners,communication --recipes tiny,conformer ${MERGE[@]+"${MERGE[@]}"} --out "$OUT/gpu.json"

# ---- d, h. Chorus jobs as a cluster user runs them (--address): one learner actor holding the GPU, then
# two gossip learners sharing it, half each (gpus_per_learner: 0.5)
start_head ray_head_gpu "$W/rg" "$GPUS"
GPU_HEAD=$HEAD_ADDR
if [ -n "$GPU_HEAD" ]; then
  train d_tiny_gpu "$GPU_HEAD" "$D_WALL" jobs/configs/tiny.yaml --set learners=1 --set "accelerator=$ACC" \
    --set "cpus_per_learner=$GPU_CPL"
  SHARE=(); [ "$DRY" != 1 ] && SHARE=(--set gpus_per_learner=0.5)
  train h_gossip2_shared_gpu "$GPU_HEAD" "$H_WALL" jobs/configs/tiny.yaml --set learners=2 --set group.kind=gossip \
    --set "accelerator=$ACC" ${SHARE[@]+"${SHARE[@]}"} --set "cpus_per_learner=$H_CPL"
  stop_head "${HEAD_DIRS[-1]}"
else
  skip_step d_tiny_gpu "$HEAD_WHY"; skip_step h_gossip2_shared_gpu "$HEAD_WHY"
fi

# ---- f. the CPU baseline: tiny.yaml on a CPU-only head (CUDA hidden from its processes), for a GPU/CPU ratio
start_head ray_head_cpu "$W/rc" 0 CUDA_VISIBLE_DEVICES=
if [ -n "$HEAD_ADDR" ]; then
  TRAIN_ENV=(CUDA_VISIBLE_DEVICES=)
  train f_tiny_cpu "$HEAD_ADDR" "$F_WALL" jobs/configs/tiny.yaml --set learners=1 --set accelerator=cpu \
    --set "cpus_per_learner=$CPU_CPL"
  TRAIN_ENV=()
  stop_head "${HEAD_DIRS[-1]}"
else
  skip_step f_tiny_cpu "$HEAD_WHY"
fi
log "steps done"
