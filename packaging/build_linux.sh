#!/usr/bin/env bash
# Builds the Linux bundle and its installer archive:
#   dist/tramontane/                                   one folder: tramontane, tramontane-cli (link), _internal/
#   dist/tramontane-<version>-linux-<arch>.tar.gz      that folder + install.sh + desktop entry + icons
#
# Run from anywhere, with the Python that has the app installed (`pip install .`), the torch
# build to ship, and pyinstaller:   PYTHON=.venv/bin/python packaging/build_linux.sh
# Env: PYTHON (default python3), TRAMONTANE_BUNDLE_TRITON (see tramontane.spec),
#      NO_ARCHIVE=1 to stop after dist/tramontane/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

VERSION=$("$PY" -c 'import tramontane; print(tramontane.__version__)')
case "$VERSION" in 0+unknown*|"") echo "build_linux.sh: tramontane is not installed in $PY (pip install .)" >&2; exit 1;; esac
ARCH=$(uname -m)
NAME="tramontane-$VERSION-linux-$ARCH"

t0=$(date +%s)
"$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist --workpath build/pyinstaller packaging/tramontane.spec
# On Linux the console/windowed distinction does not exist: tramontane-cli becomes a link to
# tramontane (entry_gui.py dispatches on the name it was started as), so the 30+ MB Python
# archive each executable embeds is shipped once.
ln -sfn tramontane dist/tramontane/tramontane-cli
t1=$(date +%s)
echo "bundle: dist/tramontane ($(du -sh dist/tramontane | cut -f1), $((t1 - t0)) s)"
[ "${NO_ARCHIVE:-0}" = 1 ] && exit 0

# Stage with hard links (no second copy of ~1 GB), then one archive with one top folder.
STAGE="build/$NAME"
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -al dist/tramontane "$STAGE/tramontane"
cp packaging/linux/install.sh packaging/linux/tramontane.desktop "$STAGE/"
cp packaging/icons/tramontane.png "$STAGE/tramontane.png"
cp resources/icon.svg "$STAGE/tramontane.svg"
cat > "$STAGE/README.txt" <<TXT
Tramontane $VERSION for Linux ($ARCH)

Install for your user:   ./install.sh          (then find Tramontane in the applications menu)
Remove:                  ./install.sh --uninstall
Run without installing:  ./tramontane/tramontane
Check the installation:  ./tramontane/tramontane --self-test
TXT
GZ=gzip
command -v pigz >/dev/null 2>&1 && GZ=pigz
tar -C build -cf - "$NAME" | "$GZ" -6 > "dist/$NAME.tar.gz"
rm -rf "$STAGE"
t2=$(date +%s)
echo "archive: dist/$NAME.tar.gz ($(du -sh "dist/$NAME.tar.gz" | cut -f1), $((t2 - t1)) s)"
