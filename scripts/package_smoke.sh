#!/usr/bin/env bash
# Packaging smoke test: build the Linux bundle from a clean clone and run what a user would.
#
#   scripts/package_smoke.sh [REPO]        REPO: path or URL to clone (default: this checkout;
#                                          a clone holds the COMMITTED state of HEAD only)
#
# Steps: git clone -> a venv (a fresh one with CPU torch ($TRAMONTANE_TORCH, default
# torch==2.13.0) and `pip install .`, or the one named by VENV) + pyinstaller ->
# packaging/build_linux.sh -> in the bundle: `tramontane --version`, `tramontane --self-test`
# (offscreen Qt: load the bundled tiny model with its projector, the native CPU kernels, a first
# turn with an image, a second turn from the KV cache, stop, a second chat, regenerate, the
# store, the window), `tramontane-cli info` and `tramontane-cli self-test`, then
# tests/e2e/test_bundle.py against the bundle (every quantization's kernels, a hub download and
# a remote server on loopback fakes, the window's start), the start time (launch to window
# visible), the Qt plugins present -> install.sh into a throw-away HOME, run the installed
# command, uninstall.
#
# CI (.ci/run) runs it after the tests with VENV=.venv, reusing the venv scripts/test.sh made
# (torch, the app's dependencies): ~5 min on 2 cores (pyinstaller install ~0.5 min, build ~2-3
# min, archive ~1 min, runs ~0.5 min), ~3 GB of disk, removed at the end. Without VENV it makes
# its own venv (+3-6 min of pip). By hand:
#     nohup scripts/package_smoke.sh > /tmp/package_smoke.log 2>&1 &
# Env: VENV (reuse this venv: it must hold torch and the app's dependencies), PYTHON (python3
#      with venv, for a fresh venv), WORK (folder to use; default a new /tmp dir), KEEP=1 (keep
#      WORK), PYINSTALLER (pip requirement, default pyinstaller==6.22.3), X11_DEPS=1 (as root
#      on Debian/Ubuntu: apt-get install Xvfb and the libraries Qt's xcb plugin links, so they
#      are bundled and a real X11 window is checked; CI sets it; best effort),
#      TRAMONTANE_TRITON_AOT_BUILD (full | subset | 0: the ahead-of-time Triton kernels, see
#      packaging/tramontane.spec; default: the spec's auto (full) with CUDA torch, else subset
#      when the venv has Triton's NVIDIA backend - a CPU bundle then still proves the cubins
#      and their manifest get in: ~100 compiles, ~2-4 min on 2 cores, less from Triton's cache).
# Prints SMOKE OK on success; exits non-zero at the first failing step.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
REPO=${1:-$HERE}
PY=${PYTHON:-python3}
WORK=${WORK:-$(mktemp -d /tmp/tramontane-smoke.XXXXXX)}
cleanup() { [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT

step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
t_start=$(date +%s)

if [ "${X11_DEPS:-0}" = 1 ]; then
    step "Xvfb + the xcb plugin's libraries (apt-get, best effort)"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
              xvfb xauth libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 \
              libxcb-render-util0 libxcb-shape0 libxcb-xkb1 libxkbcommon-x11-0 >/dev/null; } \
            || echo "(apt-get failed: the bundle may lack the xcb libraries; the X11 check may be skipped)"
    else
        echo "(not root or no apt-get: skipped)"
    fi
fi

step "clone $REPO -> $WORK/src"
git clone -q "$REPO" "$WORK/src"
git -C "$WORK/src" log --oneline -1

if [ -n "${VENV:-}" ]; then
    step "reuse the venv $VENV + pyinstaller"
    V="$(cd "$VENV" && pwd)/bin"
    # The spec analyses the clone's sources (staged as installed), whatever tramontane the venv
    # holds (CI's: an editable install of the same commit); the venv gives torch, Qt and the rest.
    "$V/python" -c 'import torch, PySide6, gguf, tokenizers, PIL, numpy, huggingface_hub, platformdirs'
else
    step "venv + CPU torch + the app + pyinstaller"
    "$PY" -m venv "$WORK/venv"
    V="$WORK/venv/bin"
    "$V/python" -m pip install -q --upgrade pip
    "$V/python" -m pip install -q "${TRAMONTANE_TORCH:-torch==2.13.0}"
    "$V/python" -m pip install -q "$WORK/src" pytest
fi
"$V/python" -m PyInstaller --version >/dev/null 2>&1 \
    || "$V/python" -m pip install -q "${PYINSTALLER:-pyinstaller==6.22.3}"
"$V/python" -m piplicenses --version >/dev/null 2>&1 \
    || "$V/python" -m pip install -q "${PIP_LICENSES:-pip-licenses==5.5.5}"  # the bundle's third-party notices
"$V/python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
echo "pyinstaller $("$V/python" -m PyInstaller --version)"
t_pip=$(date +%s)

if [ -z "${TRAMONTANE_TRITON_AOT_BUILD:-}" ]; then
    TRAMONTANE_TRITON_AOT_BUILD=$("$V/python" -c 'import importlib.util as u, os, torch
s = u.find_spec("triton")
ptxas = s is not None and os.path.exists(os.path.join(os.path.dirname(s.origin), "backends/nvidia/bin/ptxas"))
print("auto" if torch.version.cuda else "subset" if ptxas else "0")')
fi
export TRAMONTANE_TRITON_AOT_BUILD
echo "ahead-of-time Triton kernels: $TRAMONTANE_TRITON_AOT_BUILD"

step "build"
cd "$WORK/src"
PYTHON="$V/python" packaging/build_linux.sh
t_build=$(date +%s)

B="$WORK/src/dist/tramontane"
export QT_QPA_PLATFORM=offscreen
unset TRITON_INTERPRET || true
export TRAMONTANE_DATA_DIR="$WORK/data"  # never touch the real user's chats
# A failing step prints its traceback too (the first thing to read when a module is missing).
export TRAMONTANE_SELFTEST_TRACEBACK=1

step "run the bundle"
VERSION=$("$V/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
out=$("$B/tramontane" --version)
echo "$out"
[ "$out" = "Tramontane $VERSION" ] || { echo "version: expected 'Tramontane $VERSION'" >&2; exit 1; }
selftest_out="$WORK/selftest.txt"
timeout 600 "$B/tramontane" --self-test | tee "$selftest_out"
# Every step the self-test has must have run (not just "no failure").
for s in version model kernels vision turn1 turn2 stop new-chat regenerate store gui; do
    grep -Eq "^  $s +ok " "$selftest_out" || { echo "self-test step '$s' did not pass" >&2; exit 1; }
done
MODEL=$(find "$B" -name mistral3_tiny-f32.gguf -path '*resources/selftest/*' -print -quit)
[ -n "$MODEL" ] || { echo "the self-test model is not in the bundle" >&2; exit 1; }
"$B/tramontane-cli" info "$MODEL"
timeout 600 "$B/tramontane-cli" self-test
if command -v xvfb-run >/dev/null 2>&1; then  # a real X11 window through the bundled xcb plugin
    QT_QPA_PLATFORM=xcb timeout 600 xvfb-run -a "$B/tramontane" --self-test
else
    echo "(xvfb-run not installed: the xcb window check is skipped)"
fi

step "exercise the bundle: tests/e2e/test_bundle.py (every quantization, hub download, remote server, window)"
TRAMONTANE_BUNDLE="$B" "$V/python" -m pytest -q -p no:cacheprovider tests/e2e/test_bundle.py

step "start time (launch to main window visible, offscreen; data dir without a model)"
# entry_gui.py's TRAMONTANE_LAUNCH_TIME: the app quits once its window is visible and says when.
for run in 1 2 3; do
    rm -rf "$WORK/data-start"
    TRAMONTANE_DATA_DIR="$WORK/data-start" TRAMONTANE_LAUNCH_TIME=$(date +%s.%N) \
        timeout 120 "$B/tramontane" | grep '^startup:' | sed "s/^/  run $run: /"
done

step "bundle contents"
QT_PLUGINS=$(find "$B" -type d -path '*Qt/plugins' -print -quit)
for plugin in platforms/libqxcb.so platforms/libqoffscreen.so platforms/libqwayland.so \
              imageformats/libqsvg.so imageformats/libqjpeg.so; do
    if [ -f "$QT_PLUGINS/$plugin" ]; then echo "  have $plugin"; else echo "  MISSING $plugin"; missing=1; fi
done
[ -z "${missing:-}" ] || { echo "Qt plugins missing" >&2; exit 1; }
[ -n "$(find "$B" -path '*tramontane/kernels/qmatmul.py' -print -quit)" ] || { echo "kernel sources missing" >&2; exit 1; }
if [ "$TRAMONTANE_TRITON_AOT_BUILD" != 0 ]; then
    # the cubins the bundle launches without a compiler: manifest, every file, every target
    AOT_DIR=$(dirname "$(find "$B" -path '*tramontane/kernels/aot_cubins/manifest.json' -print -quit)")
    [ "$AOT_DIR" != . ] || { echo "ahead-of-time Triton kernels missing from the bundle" >&2; exit 1; }
    aot_summary=$("$V/python" -m tramontane.kernels.aot "$AOT_DIR")  # fails the step if incomplete
    echo "  have kernels/aot_cubins: $aot_summary"
fi
# licences: ours, and every shipped distribution's (Qt's LGPL text among them)
grep -q "Apache License" "$B/_internal/licenses/LICENSE" || { echo "LICENSE missing from the bundle" >&2; exit 1; }
for shipped in "PySide6_Essentials" "torch" "GNU LESSER GENERAL PUBLIC LICENSE"; do
    grep -q "$shipped" "$B/_internal/licenses/THIRD_PARTY_NOTICES.txt" \
        || { echo "third-party notices lack $shipped" >&2; exit 1; }
done
echo "  have licenses/LICENSE and licenses/THIRD_PARTY_NOTICES.txt ($(du -k "$B/_internal/licenses/THIRD_PARTY_NOTICES.txt" | cut -f1) KiB)"
echo "bundle: $(du -sh "$B" | cut -f1); archive: $(du -sh dist/*.tar.gz | cut -f1)"
echo "largest parts:"
# (awk NR<= rather than head: head closing the pipe early is a SIGPIPE failure under pipefail)
du -s "$B"/_internal/* | sort -rn | awk 'NR <= 12 {printf "  %6.0f MB  %s\n", $1/1024, $2}'
echo "largest files:"
find "$B" -type f -size +20M -printf '%s %P\n' | sort -rn | awk 'NR <= 10 {printf "  %6.0f MB  %s\n", $1/1048576, $2}'

step "install.sh from the archive into a throw-away HOME"
mkdir -p "$WORK/unpack" "$WORK/home"
tar -C "$WORK/unpack" -xzf dist/*.tar.gz
INST=$(ls -d "$WORK"/unpack/tramontane-*)
HOME="$WORK/home" XDG_DATA_HOME= XDG_BIN_HOME= sh "$INST/install.sh"
H="$WORK/home"
test -x "$H/.local/opt/tramontane/tramontane"
test -L "$H/.local/bin/tramontane" && test -L "$H/.local/bin/tramontane-cli"
test -f "$H/.local/share/icons/hicolor/256x256/apps/tramontane.png"
grep -q "^Exec=\"$H/.local/opt/tramontane/tramontane\"" "$H/.local/share/applications/tramontane.desktop"
if command -v desktop-file-validate >/dev/null 2>&1; then
    desktop-file-validate "$H/.local/share/applications/tramontane.desktop"
fi
"$H/.local/bin/tramontane" --version
"$H/.local/bin/tramontane-cli" info "$H/.local/opt/tramontane/_internal/tramontane/resources/selftest/mistral3_tiny-f32.gguf" > /dev/null
HOME="$WORK/home" sh "$INST/install.sh" --uninstall
test ! -e "$H/.local/opt/tramontane" && test ! -e "$H/.local/bin/tramontane" \
    && test ! -e "$H/.local/share/applications/tramontane.desktop"

t_end=$(date +%s)
echo
echo "times: venv/pip $((t_pip - t_start)) s, build+archive $((t_build - t_pip)) s, total $((t_end - t_start)) s"
echo "SMOKE OK"
