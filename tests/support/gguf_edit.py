"""Make edited copies of GGUF fixtures for tests (llama-labelled copies, neighbours that must be
refused, Ollama-layout projectors...), using gguf-py's reader and writer (not our engine).

Everything not named in an edit is copied unchanged: the same keys in the same order with the
same value types, and the same tensor bytes.

Conventions
- Keys: `set_kv` values are Python values; the type of an existing key is kept, a new key's
  type is inferred (bool -> BOOL, int -> UINT32 (INT64 if negative/large), float -> FLOAT32,
  str -> STRING, list -> ARRAY of the first item's type). Force a type with a tuple
  `(value, GGUFValueType.X)` or `(list, GGUFValueType.ARRAY, GGUFValueType.SUB)`.
- Order of key edits: `drop_kv`, then `rename_arch` (moves every `<old arch>.*` key to
  `<new arch>.*` and sets `general.architecture`), then `set_kv` (names are final names).
- Tensors: shapes are numpy/torch order `(rows, cols)`. A value is a float32/float16/int
  ndarray, or `(uint8 ndarray of shape (rows, bytes_per_row), GGMLQuantizationType)` for raw
  quantized blocks. Order of tensor edits: `drop_tensors`, `rename_tensors` (old -> new, in
  place), `replace_tensors` (by final name, in place), then `add_tensors` (appended).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quant_shape_to_byte_shape

_PLAIN_NUMPY_TYPES = {
    GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.F64,
    GGMLQuantizationType.I8, GGMLQuantizationType.I16, GGMLQuantizationType.I32,
    GGMLQuantizationType.I64,
}


class GGUFEditError(ValueError):
    """An edit named a key or tensor that is not there (or already there)."""


def _field_value(field) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """(value, type, sub_type) of a reader field, strings kept as raw bytes so that nothing is
    re-encoded."""
    main = field.types[0]
    if main == GGUFValueType.STRING:
        return bytes(field.parts[-1]), main, None
    if main == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if len(field.types) != 2:
            raise GGUFEditError(f"{field.name}: nested arrays are not supported")
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]) for i in field.data], main, sub
        return [field.parts[i].tolist()[0] for i in field.data], main, sub
    return field.parts[-1].tolist()[0], main, None


def _infer_type(key: str, value: Any) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    if isinstance(value, tuple):
        if len(value) == 2:
            return value[0], value[1], None
        if len(value) == 3:
            return value[0], value[1], value[2]
        raise GGUFEditError(f"set_kv[{key!r}]: a typed value is (value, type[, sub_type])")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if not value:
            raise GGUFEditError(f"set_kv[{key!r}]: empty arrays cannot be written")
        _, sub, _ = _infer_type(key, value[0])
        if sub == GGUFValueType.UINT32 and any(isinstance(v, int) and v < 0 for v in value):
            sub = GGUFValueType.INT32
        return list(value), GGUFValueType.ARRAY, sub
    if isinstance(value, (bool, np.bool_)):
        return bool(value), GGUFValueType.BOOL, None
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if 0 <= value < 2**32:
            return value, GGUFValueType.UINT32, None
        return value, GGUFValueType.INT64, None
    if isinstance(value, (float, np.floating)):
        return float(value), GGUFValueType.FLOAT32, None
    if isinstance(value, (str, bytes)):
        return value, GGUFValueType.STRING, None
    raise GGUFEditError(f"set_kv[{key!r}]: cannot store a {type(value).__name__}")


def _tensor_payload(name: str, value: Any) -> tuple[np.ndarray, GGMLQuantizationType | None]:
    if isinstance(value, tuple):
        data, qtype = value
        data = np.ascontiguousarray(data)
        if data.dtype != np.uint8:
            raise GGUFEditError(f"tensor {name!r}: raw quantized data must be uint8, got {data.dtype}")
        return data, GGMLQuantizationType(qtype)
    if not isinstance(value, np.ndarray):
        raise GGUFEditError(f"tensor {name!r}: expected an ndarray or (uint8 bytes, type), got {type(value).__name__}")
    return np.ascontiguousarray(value), None


def read_tensor_payload(tensor) -> tuple[np.ndarray, GGMLQuantizationType | None]:
    """The bytes of a reader tensor in the form GGUFWriter.add_tensor takes back unchanged."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape))  # numpy order
    if qtype in _PLAIN_NUMPY_TYPES:
        return tensor.data.reshape(shape), None
    byte_shape = quant_shape_to_byte_shape(shape, qtype)
    return tensor.data.view(np.uint8).reshape(byte_shape), qtype


def rewrite_gguf(
    src: str | Path,
    dst: str | Path,
    *,
    set_kv: dict[str, Any] | None = None,
    drop_kv: list[str] | None = None,
    rename_arch: str | None = None,
    add_tensors: dict[str, Any] | None = None,
    drop_tensors: list[str] | None = None,
    rename_tensors: dict[str, str] | None = None,
    replace_tensors: dict[str, Any] | None = None,
) -> Path:
    """Write `dst`: a copy of `src` with the given edits (see the module docstring)."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise GGUFEditError(f"{dst}: rewrite into a different file than the source")
    reader = GGUFReader(src)

    # ---- keys
    kv: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # header pseudo-fields (version, counts)
            continue
        kv[key] = _field_value(field)
    if "general.architecture" not in kv:
        raise GGUFEditError(f"{src}: no general.architecture")
    for key in drop_kv or []:
        if key not in kv:
            raise GGUFEditError(f"{src}: drop_kv: no key {key!r}")
        del kv[key]
    arch = kv["general.architecture"][0]
    arch = arch.decode("utf-8") if isinstance(arch, bytes) else arch
    if rename_arch is not None:
        old_prefix, new_prefix = f"{arch}.", f"{rename_arch}."
        kv = {
            (new_prefix + k[len(old_prefix):] if k.startswith(old_prefix) else k): v
            for k, v in kv.items()
        }
        arch = rename_arch
        kv["general.architecture"] = (rename_arch, GGUFValueType.STRING, None)
    for key, value in (set_kv or {}).items():
        if key in kv and not isinstance(value, tuple):
            _, vtype, sub = kv[key]
            if isinstance(value, np.ndarray):
                value = value.tolist()
            kv[key] = (value, vtype, sub)
        else:
            kv[key] = _infer_type(key, value)
        if key == "general.architecture":
            arch = value.decode("utf-8") if isinstance(value, bytes) else str(kv[key][0])

    # ---- tensors
    tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]] = {
        t.name: read_tensor_payload(t) for t in reader.tensors
    }
    for name in drop_tensors or []:
        if name not in tensors:
            raise GGUFEditError(f"{src}: drop_tensors: no tensor {name!r}")
        del tensors[name]
    for old, new in (rename_tensors or {}).items():
        if old not in tensors:
            raise GGUFEditError(f"{src}: rename_tensors: no tensor {old!r}")
        if new in tensors and new != old:
            raise GGUFEditError(f"{src}: rename_tensors: {new!r} already exists")
    if rename_tensors:
        tensors = {rename_tensors.get(n, n): v for n, v in tensors.items()}
    for name, value in (replace_tensors or {}).items():
        if name not in tensors:
            raise GGUFEditError(f"{src}: replace_tensors: no tensor {name!r}")
        tensors[name] = _tensor_payload(name, value)
    for name, value in (add_tensors or {}).items():
        if name in tensors:
            raise GGUFEditError(f"{src}: add_tensors: {name!r} already exists")
        tensors[name] = _tensor_payload(name, value)

    # ---- write
    writer = GGUFWriter(dst, arch)  # writes general.architecture first, as the converter does
    if "general.alignment" in kv:
        writer.data_alignment = int(kv["general.alignment"][0])
    for key, (value, vtype, sub) in kv.items():
        if key == "general.architecture":
            continue
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


# ----------------------------------------------------------------------------- common neighbours
def llama_labelled_copy(src: str | Path, dst: str | Path) -> Path:
    """What bartowski's Mistral-Small-3.1 files look like: `general.architecture = llama`, every
    `mistral3.*` key under `llama.*`, tensors unchanged."""
    return rewrite_gguf(src, dst, rename_arch="llama")


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    # inverse of llama.cpp's convert-time permute (interleaved pairs -> HF rotate-half rows)
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def ollama_projector_renames(tensor_names) -> dict[str, str]:
    """llama.cpp mmproj tensor names -> Ollama's names (see shared/docs/mistral3.md)."""
    fixed = {"v.pre_ln.weight": "v.encoder_norm.weight",
             "mm.input_norm.weight": "mm.norm.weight",
             "mm.patch_merger.weight": "mm.patch_merger.merging_layer.weight"}
    out = {}
    for name in tensor_names:
        new = fixed.get(name, name)
        new = new.replace("v.patch_embd.", "v.patch_conv.")
        new = new.replace(".ln1.", ".attn_norm.").replace(".ln2.", ".ffn_norm.")
        new = new.replace(".attn_out.", ".attn_output.")
        if new.startswith("mm.1."):
            new = "mm.linear_1." + new[len("mm.1."):]
        if new.startswith("mm.2."):
            new = "mm.linear_2." + new[len("mm.2."):]
        if new != name:
            out[name] = new
    return out


def ollama_projector_copy(src: str | Path, dst: str | Path) -> Path:
    """A llama.cpp Pixtral mmproj re-laid out with Ollama's tensor names and HF's Q/K row order
    (Ollama does not permute). F32/F16 files only; `clip.*` keys unchanged."""
    reader = GGUFReader(src)
    n_head = int(reader.fields["clip.vision.attention.head_count"].contents())
    replace = {}
    for t in reader.tensors:
        if t.name.startswith("v.blk.") and t.name.split(".")[3] in ("attn_q", "attn_k"):
            data, qtype = read_tensor_payload(t)
            if qtype is not None:
                raise GGUFEditError(f"{src}: {t.name} is quantized; un-permuting needs F32/F16")
            replace[t.name] = _unpermute_rows(np.array(data), n_head)
    renames = ollama_projector_renames([t.name for t in reader.tensors])
    del reader
    return rewrite_gguf(src, dst, replace_tensors={renames.get(n, n): w for n, w in replace.items()},
                        rename_tensors=renames)


def with_img_break(mmproj: str | Path, text_gguf: str | Path, dst: str | Path, token_id: int = 12) -> Path:
    """The mmproj plus `v.token_embd.img_break` (F32, text hidden) = row `token_id` of the text
    model's token_embd — what older llama.cpp converters wrote."""
    reader = GGUFReader(text_gguf)
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    if GGMLQuantizationType(emb.tensor_type) not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        raise GGUFEditError(f"{text_gguf}: token_embd must be F32/F16 here")
    row = np.array(read_tensor_payload(emb)[0][token_id], dtype=np.float32)
    return rewrite_gguf(mmproj, dst, add_tensors={"v.token_embd.img_break": row})


def with_vocabulary(model: str | Path, vocab_gguf: str | Path, dst: str | Path, seed: int = 0) -> Path:
    """The text model with another file's tokenizer: its `tokenizer.*` keys replaced by every
    `tokenizer.*` key of `vocab_gguf` (a vocabulary-only file may do), the vocabulary size set to
    match, and `token_embd` / `output` resized to it with random F16 rows. A small model that a
    tool wanting a whole model (llama-server) loads, with a real tokenizer."""
    vocab = GGUFReader(vocab_gguf)
    tokenizer = {key: _field_value(field) for key, field in vocab.fields.items() if key.startswith("tokenizer.")}
    n_vocab = len(vocab.fields["tokenizer.ggml.tokens"].data)
    del vocab
    reader = GGUFReader(model)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    hidden = int(reader.fields[f"{arch}.embedding_length"].contents())
    old_keys = [key for key in reader.fields if key.startswith("tokenizer.")]
    head = [name for name in ("token_embd.weight", "output.weight") if any(t.name == name for t in reader.tensors)]
    del reader
    rng = np.random.default_rng(seed)
    rows = {name: (rng.standard_normal((n_vocab, hidden), dtype=np.float32) * 0.05).astype(np.float16)
            for name in head}
    return rewrite_gguf(model, dst, drop_kv=old_keys, replace_tensors=rows,
                        set_kv={**tokenizer, f"{arch}.vocab_size": n_vocab})
