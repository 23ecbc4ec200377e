#!/usr/bin/env bash
# Build here, where the package registry answers, what a GPU device call carries besides the
# working tree (both folders are git-ignored):
#
#   .whl/      wheels of the runtime packages the GPU image lacks (pydantic and its three
#              dependencies, at the versions installed here), for the image's Python
#   .gpudata/  mnist/raw/*.gz and cifar10-jpeg.tar.gz from DATA_ROOT (about 30 MB; gpu_paper.sh
#              unpacks the archive there)
#
#   bash bench/gpu_prepare.sh [DATA_ROOT] [PYTHON_VERSION]
#
# DATA_ROOT defaults to $FEDCURE_DATA_DIR, else ../shared/data; PYTHON_VERSION (the GPU image's
# python3) to 3.12. Then the device call, with carry [".whl", ".gpudata"]:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 \
#     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True && bash bench/gpu_paper.sh .gpudata $OUT 555
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-${FEDCURE_DATA_DIR:-../shared/data}}
pyver=${2:-3.12}
for f in mnist/raw/train-images-idx3-ubyte.gz mnist/raw/train-labels-idx1-ubyte.gz \
    mnist/raw/t10k-images-idx3-ubyte.gz mnist/raw/t10k-labels-idx1-ubyte.gz; do
  [ -f "$data/$f" ] || { echo "gpu_prepare: $data/$f is missing" >&2; exit 1; }
done
cifar=""
for c in "$data/cifar10/cifar10-jpeg.tar.gz" "$data/cifar10-jpeg.tar.gz"; do
  [ -f "$c" ] && cifar=$c && break
done
[ -n "$cifar" ] || { echo "gpu_prepare: no cifar10-jpeg.tar.gz in $data or $data/cifar10" >&2
  exit 1; }

rm -rf .gpudata .whl
mkdir -p .gpudata/mnist/raw .whl
cp "$data"/mnist/raw/*-ubyte.gz .gpudata/mnist/raw/
cp "$cifar" .gpudata/cifar10-jpeg.tar.gz

pins=$(python3 - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in
               ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")))
EOF
)
# shellcheck disable=SC2086 # one argument per pin
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl $pins
echo "gpu_prepare: .whl ($(ls .whl | wc -l) wheels: $pins) and .gpudata" \
  "($(du -sh .gpudata | cut -f1)) are ready"
