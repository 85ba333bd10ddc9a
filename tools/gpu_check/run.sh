#!/usr/bin/env bash
# Chorus's GPU check: one GPU, offline. From the project root on the GPU box:   make gpu-check
#   (= WHEELS=.gpu/whl bash tools/gpu_check/run.sh; WHEELS: cp312 wheels of what the image lacks, see README.md)
# Dry run on a CPU machine (project venv, accelerator=cpu, short budgets):   make gpu-check-dry
# Every step has its own timeout; a failed step is logged and the next one runs. At most TOTAL_S
# (600) seconds in all: a session's 15 minutes of device time hold one run and a machine's start. Logs: $OUT/logs/ while running, then $OUT/gpu_logs.tar.gz + $OUT/summary.txt.
set -u
T0=$(date +%s)
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WHEELS=${WHEELS:-.gpu/whl}                  # never committed: copied beside the checkout (tools/gpu_check/README.md)
DRY=${DRY:-0}
TOTAL=${TOTAL_S:-600}
DEADLINE=$((T0 + TOTAL))
RESERVE=15                                  # seconds kept for stopping Ray and packing the logs
OUT=${OUT:-/tmp/chorus-kit-out}
LOGS=$OUT/logs
W=${WORK_DIR:-/tmp/ck$$}                   # scratch: short (Ray's socket paths live under it)
P=$W/project
CORPUS=$W/tiny                              # the corpus step b synthesizes
mkdir -p "$LOGS" "$W/runs"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
if [ "$DRY" = 1 ]; then
  PY=${PY:-.venv/bin/python}; CPUS=${CPUS:-2}; GPUS=0; ACC=cpu; STORE_MB=500
  SYNTH_UTT=${SYNTH_UTT:-300}; D_WALL=${D_WALL:-20}; E_WALL=${E_WALL:-20}; F_WALL=${F_WALL:-15}; H_WALL=${H_WALL:-15}
  GPU_CPL=1; CPU_CPL=2; H_CPL=1; PROBE_STEPS=3
else
  PY=${PY:-python3}; CPUS=${CPUS:-16}; GPUS=1; ACC=gpu; STORE_MB=4000
  SYNTH_UTT=${SYNTH_UTT:-2000}; D_WALL=${D_WALL:-60}; E_WALL=${E_WALL:-60}; F_WALL=${F_WALL:-40}; H_WALL=${H_WALL:-45}
  GPU_CPL=8; CPU_CPL=16; H_CPL=8; PROBE_STEPS=10
fi
TRAIN_OVERHEAD=${TRAIN_OVERHEAD:-40}       # a job's start (actor, torch, CUDA) and final test evaluations, beyond its wall budget
echo -e "step\trc\tstart\tend\tnote" > "$LOGS/steps.tsv"
BG_PIDS=()
HEAD_DIRS=()
TRAIN_ENV=()

log() { echo "[run.sh $(( $(date +%s) - T0 ))s] $*" | tee -a "$LOGS/run.log"; }

# run_step NAME TIMEOUT CMD...: CMD under `timeout`, capped to what is left before the deadline;
# its stdout+stderr in logs/NAME.log; a line in steps.tsv whatever happens.
run_step() {
  local name=$1 t=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) - RESERVE - 10 ))
  if (( left < 10 )); then
    log "$name: skipped, no time left"; echo -e "$name\tskip\t$(date +%s.%N)\t$(date +%s.%N)\tno time left" >> "$LOGS/steps.tsv"; return 0
  fi
  (( t > left )) && t=$left
  local s; s=$(date +%s.%N)
  log "$name: start (timeout ${t}s): $*"
  { echo "=== $name: $* (timeout ${t}s, cwd $(pwd))"; } >> "$LOGS/$name.log"
  timeout -k 10 "$t" "$@" >> "$LOGS/$name.log" 2>&1 < /dev/null
  local rc=$?
  echo -e "$name\t$rc\t$s\t$(date +%s.%N)\t${NOTE:-}" >> "$LOGS/steps.tsv"
  log "$name: rc $rc after $(( $(date +%s) - ${s%.*} ))s"
  return 0
}

skip_step() { log "$1: skipped: $2"; echo -e "$1\tskip\t$(date +%s.%N)\t$(date +%s.%N)\t$2" >> "$LOGS/steps.tsv"; }

finish() {
  trap - EXIT TERM INT
  log "finishing"
  for d in ${HEAD_DIRS[@]+"${HEAD_DIRS[@]}"}; do stop_head "$d"; done
  for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do kill "$pid" 2>/dev/null; done
  cp -r "$W/ray-logs" "$LOGS/" 2>/dev/null
  # the warnings and errors of every process (learner actors log to Ray's files, not to the console)
  grep -rhE "Warning|WARNING|Error|ERROR|Traceback|Exception|cudnn|cuDNN|CUDA|not part of single contiguous" "$LOGS" \
    --include='*.log' --include='*.err' --include='*.out' 2>/dev/null \
    | grep -vE "^=== |^\[run.sh|state-dump|errored: 0|RAY_ERROR_INFO_CHANNEL|plasma error: 0|^(torch|gpu|python)=|utils.py:[0-9]+ -- Module ray.dashboard" \
    | sed -E 's/^[0-9-]+ [0-9:,]+\s+//' | sort | uniq -c | sort -rn | head -300 > "$LOGS/warnings_and_errors.txt"
  timeout 20 "$PY" "$KIT/summarize.py" "$LOGS" "$T0" > "$OUT/summary.txt" 2> "$LOGS/summarize.err" \
    || { echo "summarize.py failed (see summarize.err); steps.tsv:"; cat "$LOGS/steps.tsv"; } >> "$OUT/summary.txt"
  echo "total_s $(( $(date +%s) - T0 ))" >> "$OUT/summary.txt"
  cp "$OUT/summary.txt" "$LOGS/"
  { tar -czf "$OUT/gpu_logs.tar.gz" -C "$OUT" logs \
    || "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1], 'w:gz').add(sys.argv[2], 'logs')" "$OUT/gpu_logs.tar.gz" "$LOGS"; } \
    && rm -rf "$LOGS"
  rm -rf "$W"
  exit 0
}
trap finish EXIT
trap 'log "signal: stopping"; exit 143' TERM INT

HEAD_ADDR=""
start_head() {  # start_head NAME DIR GPUS [ENV...]: sets HEAD_ADDR ("" on failure)
  local name=$1 dir=$2 gpus=$3; shift 3
  HEAD_ADDR=""
  NOTE="gpus=$gpus" run_step "$name" 120 env "$@" "$PY" "$KIT/rayhead.py" start "$dir" --cpus "$CPUS" --gpus "$gpus" \
    --object-store-mb "$STORE_MB"
  HEAD_ADDR=$(grep -oE '^127\.0\.0\.1:[0-9]+$' "$LOGS/$name.log" | tail -1)
  [ -n "$HEAD_ADDR" ] && HEAD_DIRS+=("$dir|${HEAD_ADDR##*:}")
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
  NOTE="wall=$wall" run_step "$name" $(( wall + TRAIN_OVERHEAD )) env ${TRAIN_ENV[@]+"${TRAIN_ENV[@]}"} "$PY" "${args[@]}"
  mkdir -p "$LOGS/$name"
  for f in summary.json evals.jsonl events.jsonl; do cp "$W/runs/$name/$f" "$LOGS/$name/" 2>/dev/null; done
}

# ---- set-up: the project at a scratch path, the kit's wheels
if [ -d "$KIT/project" ]; then cp -r "$KIT/project" "$P" && cd "$P" || { log "no project copy"; exit 1; }
else P=${PROJECT:-$PWD}; cd "$P" || exit 1; [ -d orchestrator ] || { log "run from the project root (no orchestrator/ here)"; exit 1; }; fi
if [ "$DRY" = 1 ]; then
  export PYTHONPATH=${DRY_SITE:+$DRY_SITE:}$P
  echo -e "install\t0\t$T0\t$(date +%s)\tdry: the venv's packages${DRY_SITE:+ + $DRY_SITE}" >> "$LOGS/steps.tsv"
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
echo -e "c_monitors\t0\t$(date +%s)\t$(date +%s)\t${#BG_PIDS[@]} monitors" >> "$LOGS/steps.tsv"

# ---- i (first: a quick, direct check). cuDNN LSTM vs the learner's flat parameters, CPU and GPU
run_step i_lstm_probe 90 "$PY" "$KIT/lstm_probe.py" "$CORPUS" --steps "$PROBE_STEPS"

# ---- g (second: issue 40's figures). bench/gpu.py: steps at 320 s batches, then one learner, two sharing
# the GPU and Ray Train + DataLoader per recipe, 4 s windows x 5 repeats, interleaved (~6 min)
if [ "$DRY" = 1 ]; then
  skip_step g_bench_gpu "dry run (on a CPU: .venv/bin/python bench/gpu.py --device cpu, ~4 min)"
else
  run_step g_bench_gpu 420 "$PY" bench/gpu.py --repeats 5 --window 4 --steps 5 --workers $((CPUS / 2 - 1)) --corpus "$CORPUS"
  cp bench/results/gpu.json bench/results/gpu.png "$LOGS/" 2>/dev/null
fi

# ---- d, e. one learner as a Ray actor holding the GPU (the cluster user's path: --address)
start_head ray_head_gpu "$W/rg" "$GPUS"
GPU_HEAD=$HEAD_ADDR
if [ -n "$GPU_HEAD" ]; then
  train d_tiny_gpu "$GPU_HEAD" "$D_WALL" jobs/configs/tiny.yaml --set learners=1 --set "accelerator=$ACC" \
    --set "cpus_per_learner=$GPU_CPL"
  train e_conformer_bf16 "$GPU_HEAD" "$E_WALL" jobs/configs/conformer.yaml --set learners=1 --set "accelerator=$ACC" \
    --set "cpus_per_learner=$GPU_CPL" --set model.precision=bf16
else
  skip_step d_tiny_gpu "no Ray head"; skip_step e_conformer_bf16 "no Ray head"
fi

# ---- f. the CPU baseline: the same job on a CPU-only head (CUDA hidden from its processes)
start_head ray_head_cpu "$W/rc" 0 CUDA_VISIBLE_DEVICES=
if [ -n "$HEAD_ADDR" ]; then
  CPU_HEAD_ENTRY=${HEAD_DIRS[-1]}
  TRAIN_ENV=(CUDA_VISIBLE_DEVICES=)
  train f_tiny_cpu "$HEAD_ADDR" "$F_WALL" jobs/configs/tiny.yaml --set learners=1 --set accelerator=cpu \
    --set "cpus_per_learner=$CPU_CPL"
  TRAIN_ENV=()
  stop_head "$CPU_HEAD_ENTRY"
else
  skip_step f_tiny_cpu "no Ray head"
fi

# ---- h. two gossip learners sharing the one GPU, half of it each (gpus_per_learner: 0.5)
if [ -n "$GPU_HEAD" ]; then
  SHARE=(); [ "$DRY" != 1 ] && SHARE=(--set gpus_per_learner=0.5)
  train h_gossip2_shared_gpu "$GPU_HEAD" "$H_WALL" jobs/configs/tiny.yaml --set learners=2 --set group.kind=gossip \
    --set "accelerator=$ACC" "${SHARE[@]}" --set "cpus_per_learner=$H_CPL"
else
  skip_step h_gossip2_shared_gpu "no Ray head"
fi
log "steps done"
