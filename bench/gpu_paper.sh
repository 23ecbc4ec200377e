#!/usr/bin/env bash
# The paper-budget runs on one GPU, in one command that fits a 10-minute device call.
#
#   bash bench/gpu_paper.sh DATA_ROOT OUT [SECONDS] [RESULTS]
#
# DATA_ROOT holds cifar10/{train,test}/<class>/*.jpg (or cifar10-jpeg.tar.gz, unpacked here
# into DATA_ROOT/cifar10) and mnist/raw/*.gz. RESULTS (default docs/results/paper) is copied
# into a scratch folder first, so runs already cached there are not run again.
#
# What it does, in order:
#   1. decodes both datasets once (the decode cache), so the job processes start at once;
#   2. times one coalition task of both CNNs on the GPU, one by one and batched
#      (bench/batched.py steps; also the smoke test of the batched executor on CUDA: when it
#      fails, the runs below use --executor inprocess);
#   3. runs three sets at once, each Table 1, then Fig. 3 (clustering), then Fig. 4
#      (efficiency): CIFAR-10 at reading momentum, MNIST at reading momentum and CIFAR-10 at
#      reading literal, with --jobs processes each sharing the GPU;
#   4. after SECONDS (default 540) from its start, interrupts what still runs (Ctrl-C: what
#      finished stays in the run cache, a rerun resumes) and packs into OUT: results.tar.gz
#      (the scratch results folder: run caches, summaries, figures), the logs, bench.txt,
#      gpu.txt and runs.tsv (one line per trained run in the cache: dataset, run, executor,
#      device, final accuracy in %, wall seconds).
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
executor=batched
if [ "${BENCH:-1}" = 0 ]; then
  echo "benchmark skipped (BENCH=0)" > "$out/bench.txt"
elif ! timeout 150 python3 bench/batched.py steps --device "$device" --repeats 3 > "$out/bench.txt" 2>&1
then
  echo "the batched steps benchmark failed on cuda: the runs use --executor inprocess" \
    | tee -a "$out/bench.txt"
  executor=inprocess
fi
echo "bench done at $(elapsed) s" >> "$out/decode.log"

run_set() {  # dataset reading jobs
  local ds=$1 reading=$2 jobs=$3 exp
  for exp in table1 clustering efficiency; do
    echo "== $ds $reading $exp from $(elapsed) s"
    python3 -m fedcure_app.cli -v experiment "$exp" --dataset "$ds" --data-dir "$data" \
      --budget "$budget" --seeds 3 --side-seeds 1 --out "$work" --device "$device" \
      --executor "$executor" --jobs "$jobs" --reading "$reading" --no-progress || return 1
    echo "== $ds $reading $exp done at $(elapsed) s"
  done
}

set -m  # each set in its own process group, so Ctrl-C reaches all its processes
run_set cifar10 momentum 6 > "$out/cifar10-momentum.log" 2>&1 &
p1=$!
run_set mnist momentum 4 > "$out/mnist-momentum.log" 2>&1 &
p2=$!
run_set cifar10 literal 5 > "$out/cifar10-literal.log" 2>&1 &
p3=$!
while [ "$(elapsed)" -lt "$budget_s" ] && { kill -0 $p1 || kill -0 $p2 || kill -0 $p3; } 2>/dev/null
do
  sleep 2
done
for p in $p1 $p2 $p3; do kill -INT -- -"$p" 2>/dev/null; done
for _ in $(seq 20); do
  { kill -0 $p1 || kill -0 $p2 || kill -0 $p3; } 2>/dev/null || break
  sleep 1
done
for p in $p1 $p2 $p3; do kill -KILL -- -"$p" 2>/dev/null; done
echo "stopped at $(elapsed) s" >> "$out/decode.log"
python3 - "$work" > "$out/runs.tsv" <<'EOF'
import gzip, json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*/runs/*.json.gz")):
    r = json.loads(gzip.open(path).read())
    if r.get("schedule_only") or r.get("final_accuracy") is None:
        continue
    ex = r["config"].get("run", {}).get("executor", "")
    print(path.parent.parent.name, r.get("label"), ex, r.get("device"),
          f"{100 * r['final_accuracy']:.2f}", f"{r.get('wall_seconds') or 0:.1f}", sep="\t")
EOF
find "$work" -name '*.lock' -delete
tar -czf "$out/results.tar.gz" -C "$work" .
echo "packed at $(elapsed) s" >> "$out/decode.log"
