#!/usr/bin/env bash
# Adam's Fig. 8 (throughput against cores, 1...16) on a lent many-core machine, in one call.
#
# The `device` tool's machines start bare and reach nothing outside, so the call carries what the
# image lacks in the git-ignored folder .device/ (name it in the call's `carry`):
#   .device/mnist/  the MNIST idx files (a copy of ../shared/datasets/mnist, never committed)
#   .device/whl/    cp312 wheels of the core dependencies the image lacks (pyzmq, lmdb, posix_ipc)
# The image's own numpy, numba, scipy and PyTorch (the peer) are used and recorded in the record.
#
# Environment: WHEELS (default .device/whl), WORKERS (default 1...16 with the informative counts
# first), EXAMPLES, WARMUP, REPEATS, BUDGET_S (no worker count is started after it; the record holds
# those measured) and LIMIT_S (the benchmark is killed after it; the log keeps what it measured).
# Writes to $OUT (or ./device-out): machine.txt, log (every repetition's line as it is measured,
# which survives a cut-short run), cores.json and fig8.png.
set -u
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-device-out}
WORKERS=${WORKERS:-1,2,4,8,16,12,6,3,10,14,5,7,9,11,13,15}
EXAMPLES=${EXAMPLES:-6400}
REPEATS=${REPEATS:-1}
WARMUP=${WARMUP:-640}
BUDGET_S=${BUDGET_S:-400}
LIMIT_S=${LIMIT_S:-540}
WHEELS=${WHEELS:-.device/whl}
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/hogwild-site}
mkdir -p "$OUT"

{
    date -u
    nproc
    lscpu
    free -g
    df -h /dev/shm
} >"$OUT/machine.txt" 2>&1

# The missing dependencies and hogwild itself (its entry points name the parameter stores) into a
# private target; nothing is fetched.
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$WHEELS"/*.whl || exit 3
"$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
    --target "$SITE" . || exit 4
export PYTHONPATH=$SITE
"$PYTHON" - >>"$OUT/machine.txt" 2>&1 <<'EOF' || exit 5
import numba, numpy, scipy, torch, zmq, lmdb
print("python packages:", {m.__name__: m.__version__ for m in (numba, numpy, scipy, torch, zmq)})
if tuple(int(part) for part in numba.__version__.split(".")[:2]) < (0, 68):
    raise SystemExit(f"hogwild's kernels need numba >= 0.68, this image has {numba.__version__}")
EOF
tail -n 1 "$OUT/machine.txt"

export NUMBA_CACHE_DIR=/tmp/hogwild-numba  # fresh: compiled for this machine's processor
set -o pipefail
stamp() { while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done; }
echo "benchmark starts" | stamp | tee "$OUT/log"
timeout "$LIMIT_S" "$PYTHON" bench/figures/adam_fig8_cores.py --data .device/mnist --workers "$WORKERS" \
    --examples "$EXAMPLES" --warmup "$WARMUP" --repeats "$REPEATS" --time-budget "$BUDGET_S" \
    --out "$OUT/cores.json" --plot "$OUT/fig8.png" 2>&1 | stamp | tee -a "$OUT/log"
