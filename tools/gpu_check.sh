#!/usr/bin/env bash
# onnxsplit against onnxruntime's own sessions on an offline NVIDIA machine (H100/H200, 16
# cores), in one go: BERT-base 1x128 with the detected cluster (throughput: kept whole on
# the GPU, against onnxruntime's CUDA session), and with the GPU's memory limited to 40% of
# the weights (latency: one onnxruntime session running the plan, against the CPU-only
# default session and onnxruntime's capacity-aware partitioning at the same budget).
#
#   bash tools/gpu_check.sh OUT_DIR [MODEL.onnx SHAPES]     (ONLY=latency: the second half)
#
# Expects a copy of ../shared/gpu as .gpu/ (onnxruntime-gpu and wheels, see its README),
# in .gpu/extra/ the cp312 wheels of onnx-ir and ml_dtypes for an image that lacks them
# (pip download --no-deps --only-binary :all: --python-version 3.12 --platform
# manylinux_2_28_x86_64 -d .gpu/extra onnx-ir ml_dtypes), and
# the BERT-base graph (tools/build_heldout.py, weights left behind) as .gpu/models/; the
# weights are drawn afresh here (--refill).  Without a GPU (no .gpu/ or no nvidia-smi) it
# runs the CPU half on the given model, to check the script.  Tables in OUT/*.txt, every
# figure in OUT/*.json, the machine and versions in OUT/machine.txt.
set -u -o pipefail
STATUS=0  # a failed check, anywhere, fails the script
OUT=${1:?usage: gpu_check.sh OUT_DIR [MODEL SHAPES]}
mkdir -p "$OUT"
MODEL=${2:-}
SHAPES=${3:-input_ids=1x128,attention_mask=1x128}
export ONNXSPLIT_CACHE_DIR="$(mktemp -d)"  # a fresh profile, kept out of OUT (few files come back)
trap 'rm -rf "$ONNXSPLIT_CACHE_DIR"' EXIT
GPU=0
if [ -d .gpu ] && command -v nvidia-smi >/dev/null 2>&1; then
    GPU=1
    nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/machine.txt" 2>&1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl
    # onnxsplit's dependencies the image may lack (onnx_ir writes annotated.onnx's device
    # configurations), from .gpu/extra/, each only where it is missing
    python3 -c "import ml_dtypes" 2>/dev/null || python3 -m pip install -q --no-index \
        --no-deps --no-compile --target /tmp/site .gpu/extra/ml_dtypes*.whl
    python3 -c "import onnx_ir; onnx_ir.ModelConfiguration" 2>/dev/null || python3 -m pip \
        install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/extra/onnx_ir*.whl
    python3 -c "import tarfile; tarfile.open('.gpu/ort_gpu_sm90.tar.xz').extractall('/tmp/site', filter='tar')"
    export LD_LIBRARY_PATH="$(python3 .gpu/helpers.py nvlibs):${LD_LIBRARY_PATH:-}"
    export PYTHONPATH="/tmp/site:$PWD"
    python3 -c "import sys, onnx, numpy, numba, onnxruntime as o; print(sys.version.split()[0], 'onnx', onnx.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, 'onnxruntime', o.__version__, o.get_available_providers())" | tee -a "$OUT/machine.txt"
    python3 .gpu/helpers.py smoke > /tmp/smoke.txt 2>&1 || { echo "smoke test failed"; cat /tmp/smoke.txt; exit 1; }
    cat /tmp/smoke.txt >> "$OUT/machine.txt"
    python3 -m onnxsplit.solve.precompile  # a fresh machine: the solvers' kernels, not the time limit, pay
    if [ -z "$MODEL" ]; then
        mkdir -p /tmp/m && cp .gpu/models/bert_base.onnx /tmp/m/
        python3 tools/build_heldout.py /tmp/m --refill /tmp/m/bert_base.onnx
        MODEL=/tmp/m/bert_base.onnx
    fi
fi
[ -n "$MODEL" ] || { echo "gpu_check.sh: error: no GPU here: give MODEL and SHAPES to check the CPU half" >&2; exit 2; }
PY=${PYTHON:-python3}
$PY -m onnxsplit devices 2>&1 | tee -a "$OUT/machine.txt"
SECONDS=0
if [ "${ONLY:-}" != latency ]; then  # ONLY=latency: the memory-limited half alone
    echo "== throughput, detected cluster"
    timeout 270 $PY tools/bench_vs_ort.py "$MODEL:$SHAPES" --objective throughput --samples 45 \
        --time-limit 15 --json "$OUT/whole.json" 2>&1 | tee "$OUT/whole.txt" || STATUS=1
    echo "($SECONDS s)"
fi
if [ "$GPU" = 1 ]; then
    # the detected cluster with the GPU's memory at 40% of the model's weights
    $PY - "$MODEL" "$OUT/limited_cluster.json" <<'EOF'
import json, sys
from onnxsplit.cluster import Cluster
from onnxsplit.graph import OpGraph
model, out = sys.argv[1], sys.argv[2]
g = OpGraph.from_onnx(model, {"input_ids": (1, 128), "attention_mask": (1, 128)})
spec = Cluster.detect().to_json()
gpu = next(d for d in spec["devices"] if d["class"] != "cpu")
gpu["memory"] = int(0.4 * g.weight_bytes)
# the links as the detected cluster measured them (onnxsplit devices prints them)
json.dump(spec, open(out, "w"), indent=1)
print(f"GPU memory limited to {gpu['memory']} bytes (40% of {g.weight_bytes})")
EOF
    echo "== latency, GPU memory limited to 40% of the weights"
    timeout 240 $PY tools/bench_vs_ort.py "$MODEL:$SHAPES" --objective latency --samples 45 \
        --time-limit 15 --devices "$OUT/limited_cluster.json" --json "$OUT/limited.json" 2>&1 \
        | tee "$OUT/limited.txt" || STATUS=1
    echo "($SECONDS s)"
fi
exit $STATUS
