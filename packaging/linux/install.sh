#!/bin/sh
# Installs Tramontane for the current user (no root needed):
#   the app folder   -> ~/.local/opt/tramontane/      ($TRAMONTANE_PREFIX)
#   commands         -> ~/.local/bin/tramontane, tramontane-cli (symlinks; $XDG_BIN_HOME)
#   menu entry, icon -> ~/.local/share/applications/tramontane.desktop, icons/hicolor/...
# ./install.sh --uninstall removes all of these (chats and models in the data dir are kept).
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=${TRAMONTANE_PREFIX:-$HOME/.local/opt/tramontane}
BIN=${XDG_BIN_HOME:-$HOME/.local/bin}
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
DESKTOP=$DATA/applications/tramontane.desktop
ICON_PNG=$DATA/icons/hicolor/256x256/apps/tramontane.png
ICON_SVG=$DATA/icons/hicolor/scalable/apps/tramontane.svg

refresh_menus() {
    command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$DATA/applications" || true
    command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "$DATA/icons/hicolor" || true
}

if [ "${1:-}" = "--uninstall" ]; then
    for link in "$BIN/tramontane" "$BIN/tramontane-cli"; do
        # only our own links: never a command of the same name from elsewhere
        if [ -L "$link" ] && case "$(readlink "$link")" in "$PREFIX"/*) true ;; *) false ;; esac; then
            rm -f "$link"
        fi
    done
    rm -f "$DESKTOP" "$ICON_PNG" "$ICON_SVG"
    rm -rf "$PREFIX"
    refresh_menus
    echo "Tramontane removed (chats and downloaded models are kept in your data folder)."
    exit 0
fi

[ -x "$HERE/tramontane/tramontane" ] || { echo "install.sh: $HERE/tramontane/tramontane is missing: run me from the unpacked archive" >&2; exit 1; }

# Copy beside, then swap: an interrupted install never leaves a half-copied app in place.
mkdir -p "$(dirname "$PREFIX")"
rm -rf "$PREFIX.new"
cp -R "$HERE/tramontane" "$PREFIX.new"
rm -rf "$PREFIX"
mv "$PREFIX.new" "$PREFIX"

mkdir -p "$BIN" "$(dirname "$DESKTOP")" "$(dirname "$ICON_PNG")" "$(dirname "$ICON_SVG")"
ln -sfn "$PREFIX/tramontane" "$BIN/tramontane"
ln -sfn "$PREFIX/tramontane-cli" "$BIN/tramontane-cli"
cp "$HERE/tramontane.png" "$ICON_PNG"
[ -f "$HERE/tramontane.svg" ] && cp "$HERE/tramontane.svg" "$ICON_SVG"
# Absolute paths: ~/.local/bin is not on every desktop session's PATH.
sed -e "s|^Exec=.*|Exec=\"$PREFIX/tramontane\"|" \
    -e "s|^TryExec=.*|TryExec=$PREFIX/tramontane|" \
    "$HERE/tramontane.desktop" > "$DESKTOP"
chmod 644 "$DESKTOP"
refresh_menus

echo "Tramontane installed in $PREFIX"
echo "  start it from the applications menu, or run: $BIN/tramontane"
case ":$PATH:" in *":$BIN:"*) ;; *) echo "  ($BIN is not on your PATH)";; esac
