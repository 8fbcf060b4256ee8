#!/usr/bin/env bash
# Packaging smoke test: build the Linux bundle from a clean clone and run what a user would.
#
#   scripts/package_smoke.sh [REPO]        REPO: path or URL to clone (default: this checkout;
#                                          a clone holds the COMMITTED state of HEAD only)
#
# Steps: git clone -> fresh venv -> pip install torch (CPU, $TRAMONTANE_TORCH, default
# torch==2.13.0) -> pip install . pyinstaller -> packaging/build_linux.sh -> in the bundle:
# `tramontane --version`, `tramontane --self-test` (offscreen Qt), `tramontane-cli info` and
# `tramontane-cli self-test` on the bundled tiny model, the Qt plugins present -> install.sh into
# a throw-away HOME, run the installed command, uninstall.
#
# Takes ~10-20 min on 2 cores (pip ~3-6 min, PyInstaller ~3-5 min, archive ~2 min) and ~4 GB
# of disk, so it is NOT part of the default test run (scripts/test.sh / .ci/run). Run it after
# changing packaging/, pyproject dependencies or entry points:
#     nohup scripts/package_smoke.sh > /tmp/package_smoke.log 2>&1 &
# Env: PYTHON (python3 with venv), WORK (folder to use; default a new /tmp dir), KEEP=1 (keep WORK).
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

step "clone $REPO -> $WORK/src"
git clone -q "$REPO" "$WORK/src"
git -C "$WORK/src" log --oneline -1

step "venv + CPU torch + the app + pyinstaller"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install -q --upgrade pip
"$V/python" -m pip install -q "${TRAMONTANE_TORCH:-torch==2.13.0}"
"$V/python" -m pip install -q "$WORK/src" pyinstaller
"$V/python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
t_pip=$(date +%s)

step "build"
cd "$WORK/src"
PYTHON="$V/python" packaging/build_linux.sh
t_build=$(date +%s)

B="$WORK/src/dist/tramontane"
export QT_QPA_PLATFORM=offscreen
unset TRITON_INTERPRET || true
export TRAMONTANE_DATA_DIR="$WORK/data"  # never touch the real user's chats

step "run the bundle"
VERSION=$("$V/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
out=$("$B/tramontane" --version)
echo "$out"
[ "$out" = "Tramontane $VERSION" ] || { echo "version: expected 'Tramontane $VERSION'" >&2; exit 1; }
"$B/tramontane" --self-test
MODEL=$(find "$B" -name mistral3_tiny-f32.gguf -path '*resources/selftest/*' -print -quit)
[ -n "$MODEL" ] || { echo "the self-test model is not in the bundle" >&2; exit 1; }
"$B/tramontane-cli" info "$MODEL"
"$B/tramontane-cli" self-test
if command -v xvfb-run >/dev/null 2>&1; then  # a real X11 window through the bundled xcb plugin
    QT_QPA_PLATFORM=xcb xvfb-run -a "$B/tramontane" --self-test
else
    echo "(xvfb-run not installed: the xcb window check is skipped)"
fi

step "bundle contents"
QT_PLUGINS=$(find "$B" -type d -path '*Qt/plugins' -print -quit)
for plugin in platforms/libqxcb.so platforms/libqoffscreen.so platforms/libqwayland.so \
              imageformats/libqsvg.so imageformats/libqjpeg.so; do
    if [ -f "$QT_PLUGINS/$plugin" ]; then echo "  have $plugin"; else echo "  MISSING $plugin"; missing=1; fi
done
[ -z "${missing:-}" ] || { echo "Qt plugins missing" >&2; exit 1; }
[ -n "$(find "$B" -path '*tramontane/kernels/qmatmul.py' -print -quit)" ] || { echo "kernel sources missing" >&2; exit 1; }
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
echo "times: pip $((t_pip - t_start)) s, build+archive $((t_build - t_pip)) s, total $((t_end - t_start)) s"
echo "SMOKE OK"
