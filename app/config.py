"""The app's settings remembered across runs (the store's settings table), typed.

Everything lives under keys starting with `app.` so other parts (servers, model manager) can
keep their own keys in the same table. Values are validated on read: a hand-edited or old
database never crashes the window, it falls back to the default for that field. The Settings
dialog (dialogs/settings.py) is one editor of them; the chat session and the window read them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..engine.api import SamplingParams
from ..engine.server.urls import API_FAMILIES

DEVICES = ("auto", "cuda", "cpu")
RECENT_MODELS = 10  # files the Models dialog lists as opened lately
MAX_GPU_LAYERS = 999  # more than any model has; the engine keeps to the model's count
MAX_CPU_THREADS = 256
DEFAULT_SERVE_PORT = 8080
SERVE_APIS = API_FAMILIES  # every family the switch may serve


# The engine needs top_p in (0, 1]: 0 would keep no token at all.
TOP_P_MIN = 0.01
MAX_SEED = 2**63 - 1

# Each checked knob: its type and its inclusive range.
SAMPLING_RANGES: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 5.0), "top_p": (float, TOP_P_MIN, 1.0), "top_k": (int, 0, 100000),
    "repetition_penalty": (float, 0.5, 5.0), "max_tokens": (int, 1, 1 << 20),
}
# Speculative decoding, as Settings offers it (SamplingParams.speculation): off, prompt lookup, or a
# draft model (AppSettings.draft_model, loaded with the model)
SPECULATION_CHOICES = {"off": "Off", "ngram": "Prompt lookup (drafts from the chat's own text)",
                       "draft": "Draft model (a smaller model of the same vocabulary)"}
# The knobs a chat may set for itself (Chat ▸ Chat settings); the others stay the app's.
CHAT_SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "seed")
# The knobs a catalogue model's card recommends (engine/library/catalog.Sampling), used where the
# user left Settings' at their defaults (Sampling.recommended_values)
RECOMMENDED_FIELDS = ("temperature", "top_p")


def seed_from_text(text: str) -> int | None:
    """A seed field's text: '' is None (random), else a whole number 0..2^63-1; ValueError
    with a sentence otherwise."""
    text = text.strip()
    if not text:
        return None
    if not (text.isdigit() and int(text) <= MAX_SEED):
        raise ValueError(f"Seed {text!r}: give a whole number ≥ 0, or leave it empty")
    return int(text)


def _valid_knob(name: str, value: Any) -> bool:
    if name == "speculation":
        return value in SPECULATION_CHOICES
    if name == "seed":
        return value is None or (isinstance(value, int) and not isinstance(value, bool)
                                 and 0 <= value <= MAX_SEED)
    kind, lo, hi = SAMPLING_RANGES[name]
    if kind is int and isinstance(value, float) and not value.is_integer():
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi


@dataclass
class Sampling:
    """The sampling knobs the GUI exposes (a subset of SamplingParams)."""

    temperature: float = SamplingParams.temperature
    top_p: float = SamplingParams.top_p
    top_k: int = SamplingParams.top_k
    repetition_penalty: float = SamplingParams.repetition_penalty
    max_tokens: int = SamplingParams.max_tokens
    seed: int | None = None  # None: a new random draw each time
    speculation: str = SamplingParams.speculation  # lossless: the same replies, sooner when text repeats

    @classmethod
    def from_dict(cls, raw: Any) -> "Sampling":
        return cls().overlaid(raw)

    def overlaid(self, raw: Any, fields: tuple[str, ...] | None = None) -> "Sampling":
        """A copy with each valid value of the dict `raw` in place of its own (only `fields`
        when given); a missing, out-of-range or mistyped value keeps this one's."""
        out = replace(self)
        if not isinstance(raw, dict):
            return out
        for name in fields or (*SAMPLING_RANGES, "seed", "speculation"):
            if name in raw and _valid_knob(name, raw[name]):
                value = raw[name]
                setattr(out, name, value if name in ("seed", "speculation") else SAMPLING_RANGES[name][0](value))
        return out

    def recommended_values(self, recommended: Any) -> dict[str, float]:
        """What the loaded model's recommended sampling (a catalogue `Sampling`: the temperature and
        top_p its card names) sets here: each of RECOMMENDED_FIELDS that this one leaves at the app's
        default, where the card names a value; {} for None. A value the user set wins, as LM
        Studio's own choices win over a model's preset."""
        if recommended is None:
            return {}
        default = Sampling()
        return {name: getattr(recommended, name) for name in RECOMMENDED_FIELDS
                if getattr(recommended, name) is not None and getattr(self, name) == getattr(default, name)}

    def with_recommended(self, recommended: Any) -> "Sampling":
        """A copy with `recommended_values(recommended)` in place of its own."""
        return self.overlaid(self.recommended_values(recommended))

    def chat_values(self) -> dict[str, Any]:
        """The knobs a chat keeps as its own (CHAT_SAMPLING_FIELDS), as stored with it."""
        return {name: getattr(self, name) for name in CHAT_SAMPLING_FIELDS}

    def params(self, **overrides: Any) -> SamplingParams:
        values = asdict(self)
        values.update(overrides)
        return SamplingParams(**values)


class AppSettings:
    """Typed access to the `app.*` settings of a Store (anything with get_setting/set_setting)."""

    def __init__(self, store: Any):
        self.store = store

    def _get(self, key: str, default: Any = None) -> Any:
        try:
            return self.store.get_setting(f"app.{key}", default)
        except Exception:  # noqa: BLE001 - unreadable value: use the default
            return default

    def _set(self, key: str, value: Any) -> None:
        self.store.set_setting(f"app.{key}", value)

    # sampling
    @property
    def sampling(self) -> Sampling:
        return Sampling.from_dict(self._get("sampling"))

    @sampling.setter
    def sampling(self, value: Sampling) -> None:
        self._set("sampling", asdict(value))

    def _str(self, key: str, default: str = "") -> str:
        value = self._get(key, default)
        return value if isinstance(value, str) else default

    def _int(self, key: str, default: int = 0) -> int:
        value = self._get(key, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    # the folder a file dialog of each kind ("models", "images", "chats") was last used in
    def last_folder(self, kind: str) -> str:
        folder = self.store.get_setting(f"folder.{kind}", "")
        return folder if isinstance(folder, str) and folder and Path(folder).is_dir() else ""

    def remember_folder(self, kind: str, path: str) -> None:
        """`path`: a file (its folder is kept) or a folder."""
        folder = str(Path(path).parent if Path(path).suffix else Path(path))
        if folder != self.last_folder(kind):
            self.store.set_setting(f"folder.{kind}", folder)

    @property
    def default_system_prompt(self) -> str:
        return self._str("default_system_prompt")

    @default_system_prompt.setter
    def default_system_prompt(self, text: str) -> None:
        self._set("default_system_prompt", text)

    @property
    def system_prompt_presets(self) -> list[tuple[str, str]]:
        """Named system prompts (LM Studio's presets, Jan's assistants), as (name, text) in the
        order saved; an unreadable entry is left out."""
        value = self._get("system_prompt_presets")
        if not isinstance(value, list):
            return []
        return [(p["name"], p["text"]) for p in value
                if isinstance(p, dict) and isinstance(p.get("name"), str) and p["name"].strip()
                and isinstance(p.get("text"), str)]

    def save_preset(self, name: str, text: str) -> None:
        """Keep `text` as the preset `name` (stripped; one of that name is replaced in place)."""
        name = name.strip()
        if not name:
            raise ValueError("A preset needs a name")
        presets = self.system_prompt_presets
        names = [n for n, _ in presets]
        if name in names:
            presets[names.index(name)] = (name, text)
        else:
            presets.append((name, text))
        self._set("system_prompt_presets", [{"name": n, "text": t} for n, t in presets])

    def delete_preset(self, name: str) -> None:
        self._set("system_prompt_presets", [{"name": n, "text": t} for n, t in self.system_prompt_presets
                                            if n != name])

    @property
    def context_length(self) -> int:
        """0: the model's own length."""
        return max(0, self._int("context_length"))

    @context_length.setter
    def context_length(self, n: int) -> None:
        self._set("context_length", int(n))

    @property
    def draft_model(self) -> str:
        """The file Settings chose as the draft model ('' none); used while speculation is 'draft'."""
        return self._str("draft_model")

    @draft_model.setter
    def draft_model(self, path: str) -> None:
        self._set("draft_model", str(path or ""))

    @property
    def draft_to_load(self) -> str:
        """The draft file a model load takes: the chosen one while Settings' speculation is the
        draft model, else '' (no draft's weights and KV held for nothing)."""
        return self.draft_model if self.sampling.speculation == "draft" else ""

    @property
    def device(self) -> str:
        value = self._str("device", "auto")
        return value if value in DEVICES else "auto"

    @device.setter
    def device(self, value: str) -> None:
        self._set("device", value if value in DEVICES else "auto")

    @property
    def models_dir(self) -> str:
        """'' means the default (engine.library.models_folder.default_models_dir())."""
        return self._str("models_dir")

    @models_dir.setter
    def models_dir(self, path: str) -> None:
        self._set("models_dir", str(path))

    @property
    def last_model(self) -> tuple[str, str]:
        """(model path, projector path or '') loaded last; ('', '') when none."""
        value = self._get("last_model")
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return value[0], value[1]
        return "", ""

    @last_model.setter
    def last_model(self, paths: tuple[str, str]) -> None:
        """Also remembered in `recent_models`, which the Models dialog lists."""
        self._set("last_model", [str(paths[0]), str(paths[1] or "")])
        self.recent_models = [str(paths[0])] + [p for p in self.recent_models if p != str(paths[0])]

    @property
    def recent_models(self) -> list[str]:
        """Model files loaded lately (File → Open model included), newest first."""
        value = self._get("recent_models")
        if not isinstance(value, list):
            return []
        return [p for p in value if isinstance(p, str) and p][:RECENT_MODELS]

    @recent_models.setter
    def recent_models(self, paths: list[str]) -> None:
        self._set("recent_models", [str(p) for p in paths][:RECENT_MODELS])

    @property
    def gpu_layers(self) -> int | None:
        """Settings' "GPU layers: N" (the last N layers on the GPU, the rest on the CPU);
        None: the planner decides (auto)."""
        n = self._int("gpu_layers", -1)
        return n if n >= 0 else None

    @gpu_layers.setter
    def gpu_layers(self, n: int | None) -> None:
        self._set("gpu_layers", -1 if n is None or n < 0 else int(n))

    @property
    def cpu_threads(self) -> int | None:
        """Threads for the layers that run on the CPU; None: the physical cores (auto)."""
        n = self._int("cpu_threads", 0)
        return n if n > 0 else None

    @cpu_threads.setter
    def cpu_threads(self, n: int | None) -> None:
        self._set("cpu_threads", 0 if n is None or n < 1 else int(n))

    @property
    def models_tab(self) -> int:
        """The Models dialog's tab shown last."""
        return max(0, self._int("models_tab"))

    @models_tab.setter
    def models_tab(self, index: int) -> None:
        self._set("models_tab", int(index))

    @property
    def import_copy(self) -> bool:
        """The Models dialog's "copy into the models folder" choice for imports."""
        return self._get("import_copy", False) is True

    @import_copy.setter
    def import_copy(self, copy: bool) -> None:
        self._set("import_copy", bool(copy))

    @property
    def last_chat_id(self) -> int | None:
        value = self._get("last_chat_id")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @last_chat_id.setter
    def last_chat_id(self, chat_id: int | None) -> None:
        self._set("last_chat_id", chat_id)

    @property
    def font_size(self) -> int:
        """Conversation font size in points; 0: the system's."""
        size = self._int("font_size")
        return size if 6 <= size <= 48 else 0

    @font_size.setter
    def font_size(self, size: int) -> None:
        self._set("font_size", int(size))

    @property
    def serve(self) -> bool:
        """Settings' "Serve the loaded model on localhost:PORT" switch (OpenAI-compatible API)."""
        return self._get("serve", False) is True

    @serve.setter
    def serve(self, on: bool) -> None:
        self._set("serve", bool(on))

    @property
    def serve_port(self) -> int:
        port = self._int("serve_port", DEFAULT_SERVE_PORT)
        return port if 1 <= port <= 65535 else DEFAULT_SERVE_PORT

    @serve_port.setter
    def serve_port(self, port: int) -> None:
        self._set("serve_port", int(port))

    @property
    def serve_apis(self) -> tuple[str, ...]:
        """The API families the switch serves (all three unless the user left some out)."""
        value = self._get("serve_apis")
        if not isinstance(value, list):
            return SERVE_APIS
        chosen = tuple(a for a in SERVE_APIS if a in value)
        return chosen or SERVE_APIS

    @serve_apis.setter
    def serve_apis(self, apis) -> None:
        self._set("serve_apis", [a for a in SERVE_APIS if a in apis])

    @property
    def serve_ollama_port(self) -> int:
        """A second port for Ollama's clients (Ollama's own is 11434); 0: none."""
        port = self._int("serve_ollama_port", 0)
        return port if 0 <= port <= 65535 else 0

    @serve_ollama_port.setter
    def serve_ollama_port(self, port: int) -> None:
        self._set("serve_ollama_port", int(port))

    @property
    def geometry(self) -> str:
        return self._str("geometry")

    @geometry.setter
    def geometry(self, value: str) -> None:
        self._set("geometry", value)
