#!/usr/bin/env bash
# Builds the macOS app and disk image (run on a Mac from anywhere):
#   dist/Tramontane.app                                  double-clickable app (PyInstaller BUNDLE)
#   dist/tramontane-<version>-macos-<arch>.dmg           drag-to-Applications disk image
#
# Needs: Python 3.11+ with the app installed (`pip install .`; torch's macOS wheel is CPU/MPS,
# there is no CUDA or Triton on macOS: the kernels' torch path runs), pyinstaller, and hdiutil
# (part of macOS).   PYTHON=.venv/bin/python packaging/macos/build_macos.sh
# Signing: the bundle is ad-hoc signed by PyInstaller; set CODESIGN_IDENTITY="Developer ID
# Application: ..." to sign with a real identity (notarize the .dmg afterwards with notarytool).
# Not run in CI (no Mac): kept in step with build_linux.sh by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
[ "$(uname -s)" = Darwin ] || { echo "build_macos.sh: run me on macOS" >&2; exit 1; }

VERSION=$("$PY" -c 'import tramontane; print(tramontane.__version__)')
case "$VERSION" in 0+unknown*|"") echo "build_macos.sh: tramontane is not installed in $PY" >&2; exit 1;; esac
ARCH=$(uname -m)

"$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist --workpath build/pyinstaller packaging/tramontane.spec
APP=dist/Tramontane.app
[ -d "$APP" ] || { echo "build_macos.sh: $APP was not made" >&2; exit 1; }

if [ -n "${CODESIGN_IDENTITY:-}" ]; then
    codesign --force --deep --options runtime --timestamp -s "$CODESIGN_IDENTITY" "$APP"
fi
QT_QPA_PLATFORM=offscreen "$APP/Contents/MacOS/tramontane" --self-test

STAGE=build/dmg
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
DMG="dist/tramontane-$VERSION-macos-$ARCH.dmg"
rm -f "$DMG"
hdiutil create -volname "Tramontane $VERSION" -srcfolder "$STAGE" -fs HFS+ -format UDZO -ov "$DMG"
rm -rf "$STAGE"
echo "disk image: $DMG ($(du -sh "$DMG" | cut -f1))"
