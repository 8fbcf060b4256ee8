"""The dialogs the window's menus open (Models, Settings, Servers, Tools, Help) and what the
window does with their answers. The window owns the downloads, so closing the Models dialog
leaves them running.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QMenu

from ..engine.runtime.threads import apply_threads
from .dialogs.remote_endpoints import RemoteEndpointsDialog
from .dialogs.settings import SettingsDialog
from .engine_info import EngineInfo
from .widgets.model_bar import device_line


def running_fit(info: EngineInfo | None):
    """Where the loaded model runs, said like the Models dialog's plans (None: no local model)."""
    if info is None:
        return None
    from ..engine.library.fit import Fit

    kind = "partial" if info.split else "cpu" if info.device == "cpu" else "gpu"
    return Fit(kind, f"Loaded now: {device_line(info)}")


class WindowDialogs(QObject):
    """Opens the window's dialogs; `model_manager` and `help_dialog` are the last ones shown."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.session = window.session
        self.settings = window.settings
        self.downloads = None  # the app's Downloads, made when the Models dialog first opens
        self.model_manager = None
        self.help_dialog = None

    def _local_info(self) -> EngineInfo | None:
        info = self.session.engine_info
        return info if info is not None and not info.remote else None

    def open_model_manager(self, tab: int | None = None) -> None:
        from .dialogs.models import ModelManagerDialog
        from .downloads import downloads_in

        w = self.window
        try:
            # The window owns the downloads: closing the dialog leaves them running.
            self.downloads = downloads_in(self.downloads, self.settings.models_dir or None, w)
            local = self._local_info()
            dialog = ModelManagerDialog(
                downloads=self.downloads, parent=w, settings=self.settings,
                loaded_model=local.model_path if local else None,
                loaded_mmproj=local.mmproj_path if local else None, loaded_fit=running_fit(local),
                freed_bytes=local.resident_bytes if local else 0,
                context_length=local.context_size if local else self.settings.context_length or 0)
        except Exception as exc:  # noqa: BLE001
            w.model_bar.show_error(f"Cannot open the model manager: {exc}")
            return
        dialog.load_requested.connect(lambda m, p: (w.model_loading.load_model(m, p), dialog.accept()))
        if tab is not None:
            dialog.tabs.setCurrentIndex(tab)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        self.model_manager = dialog

    def open_settings(self) -> None:
        w, appearance = self.window, self.window.appearance
        local = self._local_info()
        dialog = SettingsDialog(self.settings, w, servers_dialog=self.open_servers, theme=appearance.theme,
                                loaded_model=local.model_path if local else None)
        if dialog.exec():
            w.api_server.apply(self.settings.serve, self.settings.serve_port, self.settings.serve_apis,
                               self.settings.serve_ollama_port)
            apply_threads(self.settings.cpu_threads)
            if dialog.theme_choice and dialog.theme_choice != appearance.theme:
                appearance.set_theme(dialog.theme_choice)
            if dialog.draft_changed and w.model_loading.apply_draft_setting():
                return  # the model loads again now, with every setting a load takes
            if dialog.reload_needed and self._local_info() is not None:
                w.reload_button.show()  # context, device, GPU layers: at the next load

    def open_servers(self) -> None:
        RemoteEndpointsDialog(self.window.store, self.window).exec()
        self.window.binding.reload_servers()

    def open_tools(self) -> None:
        from .dialogs.tools_page import ToolsDialog

        ToolsDialog(self.window.tools, self.window).exec()

    def show_shortcuts(self):
        from .dialogs.help import show_shortcuts

        actions = [a for menu in self.window.menuBar().findChildren(QMenu) for a in menu.actions()]
        self.help_dialog = show_shortcuts(self.window, actions)
        return self.help_dialog

    def show_about(self):
        from ..engine.library.models_folder import default_models_dir
        from .dialogs.help import show_about

        info = self.session.engine_info
        self.help_dialog = show_about(
            self.window, data_dir=str(self.window.store.data_dir),
            models_dir=self.settings.models_dir or str(default_models_dir()),
            model=info.model_path if info else "", projector=info.mmproj_path if info else "")
        return self.help_dialog

    def shutdown(self) -> None:
        """At quit: the downloads pause; their parts resume next time."""
        if self.downloads is not None:
            self.downloads.shutdown()


__all__ = ["WindowDialogs", "running_fit"]
