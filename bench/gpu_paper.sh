#!/usr/bin/env bash
# The paper-budget runs on one GPU, in one command that fits a 10-minute device call.
#
#   bash bench/gpu_paper.sh DATA_ROOT OUT [SECONDS] [RESULTS]
#
# DATA_ROOT holds cifar10/{train,test}/<class>/*.jpg (or cifar10-jpeg.tar.gz, unpacked here
# into DATA_ROOT/cifar10) and mnist/raw/*.gz; bench/gpu_prepare.sh builds such a DATA_ROOT
# (.gpudata) and the wheels the GPU image lacks (.whl), and shows the device call that carries
# them. RESULTS (default docs/results/paper) is copied into a scratch folder first, so runs
# already cached there are not run again.
#
# What it does, in order:
#   1. starts CUDA MPS where nvidia-cuda-mps-control exists and a CUDA call works under it
#      (the job processes then share the GPU's compute instead of taking turns); MPS=0 skips it;
#   2. decodes both datasets once (the decode cache), so the job processes start at once;
#   3. times one coalition task of both CNNs on the GPU, one by one and batched, with and without
#      CUDA graphs and with vmap's gradient (bench/batched.py steps). It is also the smoke test:
#      a batched variant whose edge model differs from the one-by-one one by more than 1e-3 is
#      not used (graphs off: --no-cuda-graphs; batched broken: --executor inprocess);
#   4. times one CIFAR-10 Table 1 run alone (bench/one_run.py: FedCure, seed 0, reading
#      momentum, stored in the run cache; at most 240 s; ALONE=0 skips it);
#   5. runs the sets named by SETS (default "cifar10:momentum:4 cifar10:literal:4":
#      dataset:reading:jobs), one after another, each Table 1, then Fig. 3 (clustering), then
#      Fig. 4 (efficiency), a set's job processes sharing the GPU (four CIFAR-10 runs at a time
#      finish in about 100 s each on an H200; fifteen at a time, two finished within 480 s, and
#      an unfinished run is lost when the command stops);
#   6. after SECONDS (default 540) from its start, interrupts what still runs (Ctrl-C: what
#      finished stays in the run cache, a rerun resumes) and packs into OUT: results.tar.gz
#      (the scratch results folder: run caches, summaries, figures), the logs, bench.txt,
#      gpu.txt, gpu-use.log (every 10 s while the sets run: the GPU's utilisation and memory in
#      use, and each compute process's memory) and runs.tsv (one line per trained run in the
#      cache: dataset, run, executor, device, convolution path, each path's time per edge
#      round when it was timed, final accuracy in %, wall seconds).
set -uo pipefail
# BUDGET and DEVICE override the paper budget and cuda (for a dry run on the CPU); BENCH=0
# skips step 2.
budget=${BUDGET:-paper}; device=${DEVICE:-cuda}
data=${1:?DATA_ROOT}; out=${2:?OUT}; budget_s=${3:-540}; results=${4:-docs/results/paper}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
mkdir -p "$out"
work=$(mktemp -d /tmp/fedcure-paper.XXXXXX)
cp -r "$results/." "$work/"
if [ -f "$data/cifar10-jpeg.tar.gz" ] && [ ! -d "$data/cifar10/train" ]; then
  mkdir -p "$data/cifar10" && tar -xzf "$data/cifar10-jpeg.tar.gz" -C "$data/cifar10"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" \
  >> "$out/gpu.txt" 2>&1
python3 - "$data" > "$out/decode.log" 2>&1 <<'EOF'
import sys, time
from fedcure_app.data.loader import load_dataset
for name in ("cifar10", "mnist"):
    t0 = time.perf_counter()
    d = load_dataset(name, sys.argv[1])
    print(name, d.source, f"{time.perf_counter() - t0:.1f} s")
EOF
echo "decoded at $(elapsed) s" >> "$out/decode.log"
mps=0
if [ "${MPS:-1}" != 0 ] && [ "$device" = cuda ] && command -v nvidia-cuda-mps-control >/dev/null
then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/fedcure-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fedcure-mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d && timeout 60 python3 -c \
      "import torch; assert torch.ones(4, device='cuda').sum().item() == 4"; then
    mps=1
  else
    echo quit | nvidia-cuda-mps-control 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
echo "MPS: $mps" >> "$out/gpu.txt"
executor=batched; graphs=()
if [ "${BENCH:-1}" = 0 ]; then
  echo "benchmark skipped (BENCH=0)" > "$out/bench.txt"
elif ! timeout 200 python3 bench/batched.py steps --device "$device" --repeats 3 \
    > "$out/bench.txt" 2>&1; then
  echo "the steps benchmark failed: the runs use --executor inprocess" | tee -a "$out/bench.txt"
  executor=inprocess
else
  # rows "| model | executor | wall | cpu | diff |": the largest difference of each variant
  worst() { awk -F'|' -v v="$1" '$3 ~ "^ "v" $" && $6 !~ /—/ {gsub(/ /,"",$6); print $6}' \
    "$out/bench.txt" | sort -g | tail -n 1; }
  ok() { [ -n "$1" ] && awk -v d="$1" 'BEGIN {exit !(d <= 1e-3)}'; }
  if ! ok "$(worst batched)"; then
    if [ "$device" = cuda ] && ok "$(worst "batched, no CUDA graph")"; then
      graphs=(--no-cuda-graphs)
    else
      executor=inprocess
    fi
  fi
fi
echo "bench done at $(elapsed) s: --executor $executor ${graphs[*]}" >> "$out/decode.log"

if [ "${ALONE:-1}" != 0 ]; then
  timeout 240 python3 bench/one_run.py --dataset cifar10 --data-dir "$data" --out "$work" \
    --reading momentum --executor "$executor" --device "$device" ${graphs[@]+"${graphs[@]}"} \
    > "$out/alone.log" 2>&1
  echo "one run alone done at $(elapsed) s" >> "$out/decode.log"
fi

run_set() {  # dataset reading jobs
  local ds=$1 reading=$2 jobs=$3 exp
  for exp in table1 clustering efficiency; do
    echo "== $ds $reading $exp from $(elapsed) s"
    python3 -m fedcure_app.cli -v experiment "$exp" --dataset "$ds" --data-dir "$data" \
      --budget "$budget" --seeds 3 --side-seeds 1 --out "$work" --device "$device" \
      --executor "$executor" ${graphs[@]+"${graphs[@]}"} --jobs "$jobs" --reading "$reading" \
      --no-progress || return 1
    echo "== $ds $reading $exp done at $(elapsed) s"
  done
}

run_sets() {  # one set after another: what a set leaves unfinished is lost at the stop
  local spec ds reading jobs
  for spec in ${SETS:-cifar10:momentum:4 cifar10:literal:4}; do
    IFS=: read -r ds reading jobs <<< "$spec"
    run_set "$ds" "$reading" "$jobs" > "$out/$ds-$reading.log" 2>&1
  done
}

set -m  # the sets in their own process group, so Ctrl-C reaches all their processes
pids=()
run_sets &
pids+=($!)
running() { local p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
# every 10 s: the GPU's utilisation and memory, and each compute process's memory (gpu-use.log)
sampled=0
while [ "$(elapsed)" -lt "$budget_s" ] && running; do
  if [ "$device" = cuda ] && [ $(( $(elapsed) - sampled )) -ge 10 ]; then
    sampled=$(elapsed)
    { echo "at $sampled s: $(nvidia-smi --query-gpu=utilization.gpu,memory.used \
        --format=csv,noheader 2>&1)"
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>&1 | sed 's/^/  /'
    } >> "$out/gpu-use.log"
  fi
  sleep 2
done
for p in "${pids[@]}"; do kill -INT -- -"$p" 2>/dev/null; done
for _ in $(seq 20); do running || break; sleep 1; done
for p in "${pids[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done
[ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control
echo "stopped at $(elapsed) s" >> "$out/decode.log"
python3 - "$work" > "$out/runs.tsv" <<'EOF'
import gzip, json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*/runs/*.json.gz")):
    r = json.loads(gzip.open(path).read())
    if r.get("schedule_only") or r.get("final_accuracy") is None:
        continue
    ex = r["config"].get("run", {}).get("executor", "")
    timed = (r.get("conv_choice") or {}).get("seconds", {})
    print(path.parent.parent.name, r.get("label"), ex, r.get("device"),
          r.get("conv_path") or "-",
          " ".join(f"{p}={1000 * s:.1f}ms" for p, s in timed.items()) or "-",
          f"{100 * r['final_accuracy']:.2f}", f"{r.get('wall_seconds') or 0:.1f}", sep="\t")
EOF
find "$work" -name '*.lock' -delete
tar -czf "$out/results.tar.gz" -C "$work" .
echo "packed at $(elapsed) s" >> "$out/decode.log"
