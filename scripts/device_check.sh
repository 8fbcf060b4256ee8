#!/usr/bin/env bash
# One prepared GPU check: CUDA tests + benchmarks, printing numbers; ~8 minutes at most.
#
# On the GPU machine (torch + triton + CUDA already there), from the repo root:
#     bash scripts/device_check.sh                 # all sections
#     bash scripts/device_check.sh kernels-bench   # only the named section(s)
# It installs nothing heavy: the repo with `pip install -e . --no-deps`, plus small pure-python
# test deps if missing. That machine may have no network: fetch those wheels HERE first with
#     bash scripts/device_check.sh --fetch-wheels  # -> .device_wheels/ (carry it to the GPU run)
# Logs also go to $OUT/device_check.log when $OUT is set.
#
# Adding your check: one `section NAME SECONDS command...` line in run_sections below.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${DEVICE_WHEELS:-.device_wheels}
# import name -> pip name of the small deps the tests need
declare -A DEPS=([gguf]=gguf [yaml]=pyyaml [tqdm]=tqdm [requests]=requests [urllib3]=urllib3 [idna]=idna [certifi]=certifi [pytest]=pytest [iniconfig]=iniconfig
                 [pluggy]=pluggy [packaging]=packaging [pygments]=pygments [platformdirs]=platformdirs)

if [ "${1:-}" = "--fetch-wheels" ]; then
    # small ones only (~5 MB): pure-python packages, and pyyaml for each likely python; numpy is
    # assumed present next to torch
    mkdir -p "$WHEELS"
    "$PY" -m pip download -q --no-deps -d "$WHEELS" --only-binary=:all: \
        gguf tqdm requests urllib3 idna certifi pytest iniconfig pluggy packaging pygments platformdirs \
        || echo "fetch failed"
    for pyv in 3.10 3.11 3.12 3.13; do
        "$PY" -m pip download -q --no-deps -d "$WHEELS" --only-binary=:all: --python-version "$pyv" \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 pyyaml || echo "pyyaml $pyv failed"
    done
    du -sh "$WHEELS"
    exit 0
fi

if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/device_check.log") 2>&1; fi
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

setup() {
    # DEVICE_CHECK_ALLOW_CPU=1: rehearse the script on a CPU machine (CUDA tests skip, bench says no GPU)
    "$PY" -c "import torch, triton; assert torch.cuda.is_available() or '${DEVICE_CHECK_ALLOW_CPU:-0}' == '1', 'no CUDA device'" || {
        echo "device_check: needs torch + triton with a CUDA GPU"; exit 2; }
    local missing=()
    for mod in "${!DEPS[@]}"; do "$PY" -c "import $mod" 2>/dev/null || missing+=("${DEPS[$mod]}"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing missing: ${missing[*]}"
        { [ -d "$WHEELS" ] && "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${missing[@]}"; } \
            || "$PY" -m pip install -q "${missing[@]}" || echo "WARNING: could not install ${missing[*]}"
    fi
    if "$PY" -c "import tramontane.kernels, os, sys; sys.exit(os.path.realpath(tramontane.kernels.__path__[0]) != os.path.realpath('kernels'))" 2>/dev/null; then
        echo "tramontane already importable from this checkout"
    elif ! "$PY" -m pip install -q -e . --no-deps --no-build-isolation 2>/dev/null; then
        # fallback: the tramontane.* namespace through links, no install
        local shim; shim=$(mktemp -d)
        mkdir -p "$shim/tramontane"
        cp tramontane/__init__.py "$shim/tramontane/"
        for d in app engine kernels resources; do ln -s "$PWD/$d" "$shim/tramontane/$d"; done
        export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
        echo "pip install -e failed; using PYTHONPATH shim $shim"
    fi
    nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv,noheader 2>/dev/null || true
    "$PY" -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
}

pytest_allow_none() {  # pytest, but "no tests selected" (rc 5) is not a failure
    "$PY" -m pytest "$@"; local rc=$?; [ $rc -eq 5 ] && return 0; return $rc
}
export PY
export -f pytest_allow_none

FAILED=()
declare -A TOOK
section() {  # section NAME SECONDS cmd...
    local name=$1 limit=$2; shift 2
    if [ ${#ONLY[@]} -gt 0 ] && [[ ! " ${ONLY[*]} " == *" $name "* ]]; then return; fi
    echo; echo "=================== $name (limit ${limit}s) ==================="
    local start=$SECONDS
    if declare -F "$1" >/dev/null; then  # a shell function: run it in a child bash under timeout
        timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@"
    else
        timeout --kill-after=10 "$limit" "$@"
    fi
    local rc=$?
    TOOK[$name]="rc=$rc $((SECONDS - start))s"
    echo "=================== $name: rc=$rc in $((SECONDS - start))s ==================="
    [ $rc -eq 0 ] || FAILED+=("$name")
}

run_sections() {
    # kernels: compiled Triton kernels, bit-exactness and tolerances at real sizes (all types)
    section kernels-tests 110 "$PY" -m pytest -q -x -p no:cacheprovider tests/kernels/test_cuda.py \
        tests/kernels/test_triton.py tests/kernels/test_reference.py tests/kernels/test_fixtures.py
    # kernels: decode GB/s vs copy, vs dequant+cuBLAS, Mistral-Small shapes
    section kernels-bench 80 "$PY" bench/kernels.py --rows 1,8 --dense
    # kernels: config search for Q4_K/Q6_K decode (opt-in: DEVICE_CHECK_SWEEP=1)
    if [ "${DEVICE_CHECK_SWEEP:-0}" = 1 ]; then
        section kernels-sweep 150 "$PY" bench/kernels.py --sweep --rows 1
    fi
    # every other CUDA-marked test in the repo
    section cuda-tests 90 pytest_allow_none -q -m cuda -p no:cacheprovider --continue-on-collection-errors \
        --ignore=tests/kernels/test_cuda.py tests/
    # decoder: Mistral-Small-3.1-shaped random Q4_K_M model (~14 GB), decode tok/s vs the
    # bandwidth bound (CUDA graphs and eager), prefill tok/s, TTFT
    section model-bench 110 "$PY" bench/model.py --shape mistral-small --mix q4_k_m --prompts 512 --decode 64
    # vision: encode time of 640x480 and 1540x1540 on a real-shaped tower, vs HF on the same weights
    section vision-bench 50 "$PY" bench/vision.py --shape real --device cuda --dtype f16 --repeat 3
    # device map: decode with half the layers on the CPU vs whole on the GPU, boundary copies' share
    # of a step (< 3 %); the CUDA+CPU split correctness tests run in cuda-tests (test_split.py)
    section split-bench 55 "$PY" bench/split.py --device cuda --shape ministral-3b --prompt 32 --steps 12
    # the installation self-test on the GPU: a user's first minutes (image turn, cached second
    # turn, stop, regenerate) with CUDA graphs
    section self-test 35 "$PY" -m tramontane.engine.cli.main self-test
    # (add `section NAME SECONDS command...` lines here; the limits sum to <= 9 min: now 530 s)
}

ONLY=("$@")
setup
run_sections
echo; echo "=================== summary ==================="
for k in "${!TOOK[@]}"; do echo "$k: ${TOOK[$k]}"; done
if [ ${#FAILED[@]} -gt 0 ]; then echo "FAILED: ${FAILED[*]}"; exit 1; fi
echo "all sections passed"
