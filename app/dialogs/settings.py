"""The Settings dialog: edits the app's settings (`config.AppSettings`)."""
from __future__ import annotations


from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox,
                               QFileDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from ...engine.server.urls import SHOWN_NAMES, client_urls
from ..config import (DEVICES, MAX_CPU_THREADS, MAX_GPU_LAYERS, SERVE_APIS, SPECULATION_CHOICES, TOP_P_MIN,
                      AppSettings, Sampling, seed_from_text)
from .settings_draft import DraftPicker

THEMES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))


class SettingsDialog(QDialog):
    """Default system prompt, sampling (speculative decoding and its draft model), context length,
    device, GPU layers, models folder, API server."""

    def __init__(self, settings: AppSettings, parent: QWidget | None = None, *, servers_dialog=None,
                 theme: str | None = None, loaded_model: str | None = None):
        """`theme`: the window's ('system', 'light', 'dark'): shown as a choice when given;
        after OK `theme_choice` holds the one picked and `reload_needed` says whether a
        setting that applies at the next load changed. `loaded_model`: the local model's file,
        which the draft model picker's files must suit (else the model loaded last)."""
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.settings = settings
        self.theme_choice = theme
        self.reload_needed = False
        self.draft_changed = False  # after OK: the draft a load takes changed (the model reloads)
        self.draft_picker = DraftPicker(settings, loaded_model)
        self._sampling_fields(settings)
        self._recommended_note(loaded_model)
        self._loading_fields(settings)
        folder = self._models_folder_row(settings)
        serving = self._serving_row(settings)
        self.error = QLabel()
        self.error.setStyleSheet("color: #c62828;")
        form = self._form(folder, serving, theme)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(self._buttons(servers_dialog))

    def _sampling_fields(self, settings: AppSettings) -> None:
        """The default system prompt and how replies are sampled."""
        s = settings.sampling
        self.system_prompt = QPlainTextEdit(settings.default_system_prompt)
        self.system_prompt.setPlaceholderText("Used by new chats; each chat can change its own.")
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setFixedHeight(90)
        self.temperature = self._double(0.0, 5.0, 0.05, s.temperature,
                                        "0 = always the most likely token (greedy)")
        self.top_p = self._double(TOP_P_MIN, 1.0, 0.05, s.top_p, "Nucleus sampling; 1 = off")
        self.top_k = self._int(0, 100000, s.top_k, "Keep the k most likely tokens; 0 = off")
        self.repetition_penalty = self._double(0.5, 5.0, 0.05, s.repetition_penalty,
                                               "Above 1 discourages repeating tokens; 1 = off")
        self.max_tokens = self._int(1, 1 << 20, s.max_tokens, "Longest reply, in tokens")
        self.seed = QLineEdit("" if s.seed is None else str(s.seed))
        self.seed.setPlaceholderText("random")
        self.seed.setToolTip("A number makes replies repeatable; empty = random")
        self.speculation = QComboBox()
        for value, label in SPECULATION_CHOICES.items():
            self.speculation.addItem(label, value)
        self.speculation.setCurrentIndex(max(0, self.speculation.findData(s.speculation)))
        self.speculation.setToolTip("Drafted tokens checked in one pass: the same replies, faster when "
                                    "the drafts are right. Prompt lookup drafts from the chat's own text "
                                    "(code edits, quotes); a draft model is a smaller model of the same "
                                    "vocabulary, loaded beside the model (it loads again when this changes)")

    def _recommended_note(self, loaded_model: str | None) -> None:
        """Under Top-p: the loaded model's recommended temperature and top-p (its catalogue entry's,
        from its card), and whether they are in use, which they are while the fields are left at
        their defaults (Sampling.recommended_values); hidden for a model that recommends none."""
        from ..model_prompt import catalog_entry_for

        self.recommended = QLabel()
        self.recommended.setObjectName("statusLine")
        self.recommended.setWordWrap(True)
        entry = catalog_entry_for(loaded_model) if loaded_model else None
        self._model_sampling = entry.sampling if entry is not None else None
        self._model_name = entry.name if entry is not None else ""
        for box in (self.temperature, self.top_p):
            box.valueChanged.connect(self._show_recommended)
        self._show_recommended()

    def _show_recommended(self) -> None:
        from ..model_prompt import recommended_words

        if self._model_sampling is None:
            return
        shown = Sampling(temperature=self.temperature.value(), top_p=self.top_p.value())
        used = shown.recommended_values(self._model_sampling)
        every = Sampling().recommended_values(self._model_sampling)
        default = Sampling()
        if used:
            text = (f"In use: {recommended_words(used)}, the model's recommended ({self._model_name}), "
                    f"while {'these are' if len(used) > 1 else 'this is'} left at the default; "
                    "a chat's own values win.")
        else:
            text = (f"The model's recommended: {recommended_words(every)} ({self._model_name}); the values "
                    f"set here are used instead (the model's are used where these are left at "
                    f"{default.temperature:g} and {default.top_p:g}).")
        self.recommended.setText(text)

    def _loading_fields(self, settings: AppSettings) -> None:
        """Context length, device, GPU layers (applied at the next load) and CPU threads."""
        self.context_length = self._int(0, 1 << 20, settings.context_length,
                                        "KV cache length in tokens; 0 = the model's own. "
                                        "Applies at the next model load.")
        self.context_length.setSpecialValueText("model default")
        self.device = QComboBox()
        self.device.addItems(DEVICES)
        self.device.setCurrentText(settings.device)
        self.device.setToolTip("auto = the GPU when there is one. Applies at the next model load.")
        self.gpu_layers = self._int(-1, MAX_GPU_LAYERS, -1 if settings.gpu_layers is None else settings.gpu_layers,
                                    "How many of the model's layers run on the GPU; the others run on "
                                    "the CPU. auto = as many as fit, planned from the file before "
                                    "loading. Applies at the next model load.")
        self.gpu_layers.setSpecialValueText("auto")
        self.device.currentTextChanged.connect(lambda d: self.gpu_layers.setEnabled(d != "cpu"))
        self.gpu_layers.setEnabled(settings.device != "cpu")
        self.cpu_threads = self._int(0, MAX_CPU_THREADS, settings.cpu_threads or 0,
                                     "Threads for the layers that run on the CPU; auto = one per "
                                     "physical core. Applies at once.")
        self.cpu_threads.setSpecialValueText("auto")

    def _models_folder_row(self, settings: AppSettings) -> QWidget:
        self.models_dir = QLineEdit(settings.models_dir)
        self.models_dir.setPlaceholderText("default")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        folder = QWidget()
        row = QHBoxLayout(folder)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.models_dir, 1)
        row.addWidget(browse)
        return folder

    def _serving_row(self, settings: AppSettings) -> QWidget:
        self.serve = QCheckBox("Serve the loaded model on localhost, port")
        self.serve.setChecked(settings.serve)
        self.serve.setToolTip("Other programs on this computer can use the loaded model through an "
                              "OpenAI-compatible API at http://localhost:PORT/v1 (nothing is reachable "
                              "from other machines)")
        self.serve_port = self._int(1, 65535, settings.serve_port, "The port of http://localhost:PORT/v1")
        serving = QWidget()
        column = QVBoxLayout(serving)
        column.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(self.serve)
        row.addWidget(self.serve_port)
        row.addStretch(1)
        column.addLayout(row)
        # which API families the switch serves, and where each family's clients point
        families = QHBoxLayout()
        families.addWidget(QLabel("APIs:"))
        self.serve_apis = {}
        tips = {"openai": "OpenAI's chat, completions and responses APIs (the openai SDK, most tools)",
                "anthropic": "Anthropic's Messages API, /v1/messages (the anthropic SDK, Claude Code)",
                "ollama": "Ollama's API, /api/chat and /api/generate (Open WebUI, Continue, the ollama client)"}
        for family in SERVE_APIS:
            box = QCheckBox(SHOWN_NAMES[family])
            box.setChecked(family in settings.serve_apis)
            box.setToolTip(tips[family])
            box.toggled.connect(self._show_api_urls)
            families.addWidget(box)
            self.serve_apis[family] = box
        self.serve_ollama_port = self._int(0, 65535, settings.serve_ollama_port,
                                           "Also listen on this port (Ollama's own is 11434) for clients that "
                                           "only know Ollama's; 0 = none")
        self.serve_ollama_port.setSpecialValueText("none")
        self.serve_ollama_port.setPrefix("")
        families.addWidget(QLabel("Ollama's port too:"))
        families.addWidget(self.serve_ollama_port)
        families.addStretch(1)
        column.addLayout(families)
        self.serve_urls = QLabel()
        self.serve_urls.setObjectName("apiServerUrls")
        self.serve_urls.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        column.addWidget(self.serve_urls)
        for box in (self.serve_port, self.serve_ollama_port):
            box.valueChanged.connect(self._show_api_urls)
        self._show_api_urls()
        return serving

    def chosen_apis(self) -> tuple[str, ...]:
        return tuple(f for f, box in self.serve_apis.items() if box.isChecked())

    def _show_api_urls(self) -> None:
        """Each chosen family's URL to paste into its clients (as the server will have them)."""
        urls = client_urls("127.0.0.1", self.serve_port.value(), self.chosen_apis(), self.serve_ollama_port.value())
        self.serve_urls.setText("\n".join(f"{SHOWN_NAMES[f]} clients: {url}" for f, url in urls.items())
                                or "Choose at least one API.")

    def _form(self, folder: QWidget, serving: QWidget, theme: str | None) -> QFormLayout:
        """Every field in its row; the theme's only when the window gave one."""
        form = QFormLayout()
        form.addRow("Default &system prompt:", self.system_prompt)
        form.addRow("&Temperature:", self.temperature)
        form.addRow("Top-&p:", self.top_p)
        form.addRow("", self.recommended)
        form.setRowVisible(self.recommended, self._model_sampling is not None)
        form.addRow("Top-&k:", self.top_k)
        form.addRow("&Repetition penalty:", self.repetition_penalty)
        form.addRow("&Max tokens:", self.max_tokens)
        form.addRow("S&eed:", self.seed)
        form.addRow("Speculative &decoding:", self.speculation)
        form.addRow("Draft mode&l:", self.draft_picker)
        form.labelForField(self.draft_picker).setBuddy(self.draft_picker.combo)
        self.speculation.currentIndexChanged.connect(lambda _i: self._show_draft_row(form))
        self._show_draft_row(form)
        form.addRow("&Context length:", self.context_length)
        form.addRow("&Device:", self.device)
        form.addRow("&GPU layers:", self.gpu_layers)
        form.addRow("CPU t&hreads:", self.cpu_threads)
        form.addRow("Models &folder:", folder)
        form.labelForField(folder).setBuddy(self.models_dir)
        form.addRow("&API server:", serving)
        form.labelForField(serving).setBuddy(self.serve)
        self.theme = None
        if theme is not None:
            self.theme = QComboBox()
            for key, text in THEMES:
                self.theme.addItem(text, key)
            self.theme.setCurrentIndex(max(0, self.theme.findData(theme)))
            self.theme.setToolTip("Light or dark colours, or the desktop's (also in View → Theme)")
            form.addRow("Theme:", self.theme)  # its letters are all other rows' shortcuts
        return form

    def _show_draft_row(self, form: QFormLayout) -> None:
        """The draft model's row only with that mode; its files are read when it first shows."""
        draft = self.speculation.currentData() == "draft"
        form.setRowVisible(self.draft_picker, draft)
        if draft:
            self.draft_picker.look()

    def _buttons(self, servers_dialog) -> QDialogButtonBox:
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        if servers_dialog is not None:
            servers = buttons.addButton("Servers…", QDialogButtonBox.ButtonRole.ActionRole)
            servers.clicked.connect(servers_dialog)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        return buttons

    @staticmethod
    def _double(lo: float, hi: float, step: float, value: float, tip: str) -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setSingleStep(step)
        box.setDecimals(2)
        box.setValue(value)
        box.setToolTip(tip)
        return box

    @staticmethod
    def _int(lo: int, hi: int, value: int, tip: str) -> QSpinBox:
        box = QSpinBox()
        box.setRange(lo, hi)
        box.setValue(value)
        box.setToolTip(tip)
        return box

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Models folder", self.models_dir.text())
        if folder:
            self.models_dir.setText(folder)

    def accept(self) -> None:
        try:
            seed = seed_from_text(self.seed.text())
        except ValueError as exc:
            self.error.setText(str(exc))
            self.seed.setFocus()
            return
        folder = self.models_dir.text().strip()
        if folder and Path(folder).exists() and not Path(folder).is_dir():
            self.error.setText(f"Models folder {folder}: is a file, not a folder")
            return
        draft = self.speculation.currentData() == "draft"
        if draft and not self.draft_picker.chosen():
            self.error.setText("Speculative decoding: choose a draft model, or another mode"
                               + ("" if self.draft_picker.is_checked else " (the files are still being read)"))
            self.draft_picker.combo.setFocus()
            return
        draft_before = self.settings.draft_to_load
        self.settings.sampling = Sampling(
            temperature=self.temperature.value(), top_p=self.top_p.value(), top_k=self.top_k.value(),
            repetition_penalty=self.repetition_penalty.value(), max_tokens=self.max_tokens.value(),
            seed=seed, speculation=self.speculation.currentData())
        if draft:  # another mode keeps the chosen file for when draft mode is back
            self.settings.draft_model = self.draft_picker.chosen()
        self.draft_changed = self.settings.draft_to_load != draft_before
        self.settings.default_system_prompt = self.system_prompt.toPlainText()
        gpu_layers = self.gpu_layers.value() if self.gpu_layers.value() >= 0 else None
        self.reload_needed = ((self.context_length.value(), self.device.currentText(), gpu_layers)
                              != (self.settings.context_length, self.settings.device, self.settings.gpu_layers))
        if self.theme is not None:
            self.theme_choice = self.theme.currentData()
        self.settings.context_length = self.context_length.value()
        self.settings.device = self.device.currentText()
        self.settings.gpu_layers = self.gpu_layers.value() if self.gpu_layers.value() >= 0 else None
        self.settings.cpu_threads = self.cpu_threads.value() or None
        self.settings.models_dir = folder
        if self.serve.isChecked() and not self.chosen_apis():
            self.error.setText("API server: choose at least one API to serve")
            return
        self.settings.serve = self.serve.isChecked()
        self.settings.serve_port = self.serve_port.value()
        if self.chosen_apis():
            self.settings.serve_apis = self.chosen_apis()
        self.settings.serve_ollama_port = self.serve_ollama_port.value()
        super().accept()
