"""What a chat runs on: the local model or a model of a configured server, picked on the model
bar. A chat remembers its choice (as the server's base URL + model name, so renaming the server
keeps the binding) and opening it picks that choice again.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from PySide6.QtCore import QObject

from .dialogs.remote_endpoints import EngineChoiceCombo
from .remote_endpoints import EngineChoice, RemoteEndpointList, engine_for_choice


class RemoteBinding(QObject):
    """The model bar's engine picker and the open chat's binding to it."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.store = window.store
        self.session = window.session

    def add_server_picker(self, model_bar) -> None:
        combo = EngineChoiceCombo(self.store)
        combo.setToolTip("Run on the local model or on a model of a configured server")
        combo.setAccessibleName("Model source")
        combo.choiceChanged.connect(self.model_choice_changed)
        model_bar.model_combo = combo
        model_bar.buttons.insertWidget(0, combo)

    def _combo(self):
        return getattr(self.window.model_bar, "model_combo", None)

    def chosen(self) -> EngineChoice:
        combo = self._combo()
        return combo.current_choice() if combo is not None else EngineChoice()

    def chat_binding(self) -> dict:
        combo = self._combo()
        choice = combo.current_choice() if combo is not None else None
        if choice is None or choice.is_local:
            return {"remote_url": None, "remote_model": None}
        server = RemoteEndpointList(self.store).find(choice.server)
        return {"remote_url": server.base_url if server else None, "remote_model": choice.model}

    def follow_chat_binding(self, chat_id: int) -> None:
        combo = self._combo()
        if combo is None:
            return
        info = self.store.get_chat_info(chat_id)
        notices = self.session.notices
        if not info.remote_url:
            wanted = EngineChoice()
        else:
            saved = RemoteEndpointList(self.store).load()
            server = next((s for s in saved if s.base_url == info.remote_url), None)
            if server is None:
                notices[chat_id] = (f"This chat ran on {info.remote_model} at {info.remote_url}, "
                                    f"which is no longer in Settings → Servers.")
                return
            wanted = EngineChoice(server.name, info.remote_model)
        if combo.current_choice() != wanted and not combo.set_choice(wanted):
            notices[chat_id] = f"{info.remote_model} is not listed by its server any more."

    def model_choice_changed(self, choice) -> None:
        w = self.window
        self.session.bind_current_chat(self.chat_binding())
        if choice.is_local:
            if not w.model_loading.load_last_model():
                w.worker.unload()
            return
        try:
            engine = engine_for_choice(choice, RemoteEndpointList(self.store))
        except Exception as exc:  # noqa: BLE001 - a bad server entry is shown, not raised
            w.model_bar.show_error(str(exc))
            return
        if self.session.pending is not None:
            self.session.pending.cancel.set()
        w.model_loading.checking_model = None  # a file still being read is not loaded after this choice
        self.session.loading = choice.model or "server"
        w.worker.use_engine(engine)

    def reload_servers(self) -> None:
        """The servers' list changed (Settings → Servers): the picker lists them again."""
        combo = self._combo()
        if combo is not None:
            combo.reload()


__all__ = ["RemoteBinding"]
