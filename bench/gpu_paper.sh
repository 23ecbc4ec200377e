#!/usr/bin/env bash
# The paper-budget runs on one GPU, in one command that fits a 10-minute device call.
#
#   bash bench/gpu_paper.sh DATA_ROOT OUT [SECONDS]
#
# DATA_ROOT holds cifar10/{train,test}/<class>/*.jpg (or cifar10-jpeg.tar.gz, unpacked here
# into DATA_ROOT/cifar10) and mnist/raw/*.gz; OUT receives bench.txt, the run cache
# (<dataset>/runs/, resumable: copy it back into docs/results/paper before the next call) and
# the summaries. Stops starting new experiments after SECONDS (default 540).
set -euo pipefail
data=${1:?DATA_ROOT}; out=${2:?OUT}; budget_s=${3:-540}
start=$(date +%s)
if [ -f "$data/cifar10-jpeg.tar.gz" ] && [ ! -d "$data/cifar10/train" ]; then
  mkdir -p "$data/cifar10" && tar -xzf "$data/cifar10-jpeg.tar.gz" -C "$data/cifar10"
fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" || true
python3 bench/batched.py steps --device cuda --repeats 3 > "$out/bench.txt" 2>&1 || true
for spec in "cifar10 literal" "cifar10 momentum"; do
  set -- $spec
  if [ $(( $(date +%s) - start )) -gt "$budget_s" ]; then echo "time budget spent" >&2; break; fi
  python3 -m fedcure_app.cli experiment table1 --dataset "$1" --data-dir "$data" --budget paper \
    --seeds 3 --side-seeds 1 --out "$out" --device cuda --executor batched --jobs 8 \
    --reading "$2" --no-progress 2>&1 | tail -n 40 | tee -a "$out/runs.log"
done
