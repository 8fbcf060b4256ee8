"""Typed metadata: every key is read through one accessor that names the file, the key, what it
expected and what it found; counts are bounded by what the file holds before any loop.

The files here are the committed fixtures edited with gguf-py's writer (support.gguf_edit),
one key at a time, as the issue's mutations produced them."""
from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as T

from support import FIXTURES
from support.gguf_edit import rewrite_gguf
from tramontane.engine.api import EngineError
from tramontane.engine.gguf import GGUFError, Metadata, open_gguf
from tramontane.engine.mistral3.config import describe, read_config, text_config
from tramontane.engine.mistral3.tokenizer import Tokenizer

TEXT = FIXTURES / "mistral3_tiny-q8_0.gguf"
MINISTRAL = FIXTURES / "ministral3_tiny-f32.gguf"
MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
ENGINE = Path(__file__).resolve().parents[2] / "engine"


# --- the accessor ----------------------------------------------------------------------------

KV = {"n": 7, "neg": -3, "x": 1.5, "nan": math.nan, "inf": math.inf, "flag": True, "s": "abc",
      "u8s": np.array([1, 2, 3], np.uint8), "fs": np.array([0.5, 0.25, 0.125], np.float32),
      "fnan": np.array([0.5, math.nan, 1.0], np.float32), "strs": ["a", "b"]}


@pytest.mark.parametrize("call, expected, found", [
    (lambda m: m.uint("s"), "an integer ≥ 0", "string 'abc'"),
    (lambda m: m.uint("flag"), "an integer ≥ 0", "bool True"),
    (lambda m: m.uint("x"), "an integer ≥ 0", "float 1.5"),
    (lambda m: m.uint("neg"), "an integer ≥ 0", "integer -3"),
    (lambda m: m.uint("n", 1, 5), "an integer in 1..5", "integer 7"),
    (lambda m: m.uint("u8s"), "an integer ≥ 0", "array of 3 uint8"),
    (lambda m: m.float("s"), "a finite number", "string 'abc'"),
    (lambda m: m.float("nan"), "a finite number", "float nan"),
    (lambda m: m.float("inf"), "a finite number", "float inf"),
    (lambda m: m.float("x", above=2), "a finite number above 2", "float 1.5"),
    (lambda m: m.float("strs"), "a finite number", "array of 2 strings"),
    (lambda m: m.bool("n"), "a bool", "integer 7"),
    (lambda m: m.bool("u8s"), "a bool", "array of 3 uint8"),
    (lambda m: m.string("x"), "a string", "float 1.5"),
    (lambda m: m.string("u8s"), "a string", "array of 3 uint8"),
    (lambda m: m.array_of("fs", "float", 4), "an array of 4 numbers", "array of 3 float32"),
    (lambda m: m.array_of("fnan", "float", 3), "an array of 3 numbers", "array of 3 float32 with NaN"),
    (lambda m: m.array_of("x", "float", 3), "an array of 3 numbers", "float 1.5"),
    (lambda m: m.array_of("fs", "int"), "an array of integers", "array of 3 float32"),
    (lambda m: m.array_of("u8s", "string"), "an array of strings", "array of 3 uint8"),
    (lambda m: m.array_of("strs", "int"), "an array of integers", "array of 2 strings"),
])
def test_wrong_type_names_file_key_expected_and_found(call, expected, found):
    with pytest.raises(GGUFError) as err:
        call(Metadata(KV, "/models/m.gguf"))
    text = str(err.value)
    assert text.startswith("/models/m.gguf: metadata '")
    assert f"should be {expected}, found {found}" in text, text


def test_right_types_and_defaults():
    m = Metadata(KV, "m.gguf")
    assert m.uint("n", 1, 7) == 7 and m.float("x", 0, 2) == 1.5 and m.float("n") == 7.0
    assert m.bool("flag") is True and m.string("s") == "abc" and m.array_of("strs", "string", 2) == ["a", "b"]
    assert m.array_of("fs", "float", 3).tolist() == [0.5, 0.25, 0.125]
    assert m.uint("absent", default=None) is None and m.float("absent", default=2.5) == 2.5
    with pytest.raises(GGUFError, match=r"m.gguf: metadata 'absent' is missing \(expected a string\)"):
        m.string("absent")


def test_error_type_is_chosen_by_the_caller_and_is_an_engine_error():
    from tramontane.engine.mistral3.tokenizer import TokenizerError

    with pytest.raises(TokenizerError):
        Metadata(KV, "t.gguf", TokenizerError).uint("s")
    assert issubclass(GGUFError, EngineError)


# --- the issue's examples through the real readers -------------------------------------------

def _edited(tmp_path, src, name, **edits) -> Path:
    return rewrite_gguf(src, tmp_path / f"{name}.gguf", **edits)


def _load_text(path):
    with open_gguf(path) as gf:
        text_config(gf)
        Tokenizer.from_gguf(gf)
        describe(gf)


def _load_projector(path):
    with open_gguf(path) as gf:
        read_config(gf)
        describe(gf)


TEXT_CASES = [
    ("eps-string", {"mistral3.attention.layer_norm_rms_epsilon": ("abc", T.STRING)},
     "mistral3.attention.layer_norm_rms_epsilon", "string 'abc'"),
    ("eps-nan", {"mistral3.attention.layer_norm_rms_epsilon": math.nan},
     "mistral3.attention.layer_norm_rms_epsilon", "float nan"),
    ("tokens-float", {"tokenizer.ggml.tokens": (1.5, T.FLOAT32)}, "tokenizer.ggml.tokens", "float 1.5"),
    ("template-float", {"tokenizer.chat_template": (2.0, T.FLOAT32)}, "tokenizer.chat_template", "float 2.0"),
    ("bos-string", {"tokenizer.ggml.bos_token_id": ("1", T.STRING)}, "tokenizer.ggml.bos_token_id", "string '1'"),
    ("eos-nan", {"tokenizer.ggml.eos_token_id": (math.nan, T.FLOAT32)}, "tokenizer.ggml.eos_token_id", "float nan"),
    ("unk-inf", {"tokenizer.ggml.unknown_token_id": (math.inf, T.FLOAT64)}, "tokenizer.ggml.unknown_token_id", "float inf"),
    ("pad-array", {"tokenizer.ggml.padding_token_id": ([1, 2], T.ARRAY, T.UINT32)},
     "tokenizer.ggml.padding_token_id", "array of 2 uint32"),
    ("add-bos-int", {"tokenizer.ggml.add_bos_token": (1, T.UINT8)}, "tokenizer.ggml.add_bos_token", "integer 1"),
    ("freq-base-string", {"mistral3.rope.freq_base": ("1e6", T.STRING)}, "mistral3.rope.freq_base", "string '1e6'"),
    ("freq-base-one", {"mistral3.rope.freq_base": 1.0}, "mistral3.rope.freq_base", "float 1.0"),
    ("head-count-kv-array", {"mistral3.attention.head_count_kv": ([2, 2], T.ARRAY, T.UINT32)},
     "mistral3.attention.head_count_kv", "array of 2 uint32"),
    ("context-zero", {"mistral3.context_length": 0}, "mistral3.context_length", "integer 0"),
    ("hidden-negative", {"mistral3.embedding_length": (-64, T.INT32)}, "mistral3.embedding_length", "integer -64"),
    ("token-type-float", {"tokenizer.ggml.token_type": ([1.0] * 2048, T.ARRAY, T.FLOAT32)},
     "tokenizer.ggml.token_type", "array of 2048 float32"),
]

YARN_CASES = [
    ("yarn-factor-string", {"mistral3.rope.scaling.factor": ("4", T.STRING)}, "mistral3.rope.scaling.factor", "string '4'"),
    ("yarn-factor-inf", {"mistral3.rope.scaling.factor": math.inf}, "mistral3.rope.scaling.factor", "float inf"),
    ("yarn-beta-negative", {"mistral3.rope.scaling.yarn_beta_fast": -1.0},
     "mistral3.rope.scaling.yarn_beta_fast", "float -1.0"),
    ("yarn-original-array", {"mistral3.rope.scaling.original_context_length": ([16], T.ARRAY, T.UINT32)},
     "mistral3.rope.scaling.original_context_length", "array of 1 uint32"),
    ("temperature-nan", {"mistral3.attention.temperature_scale": math.nan},
     "mistral3.attention.temperature_scale", "float nan"),
]

PROJECTOR_CASES = [
    ("projector-type-u8-array", {"clip.projector_type": ([112, 105], T.ARRAY, T.UINT8)},
     "clip.projector_type", "array of 2 uint8"),
    ("merge-array", {"clip.vision.spatial_merge_size": ([2, 2], T.ARRAY, T.UINT32)},
     "clip.vision.spatial_merge_size", "array of 2 uint32"),
    ("mean-scalar", {"clip.vision.image_mean": (0.5, T.FLOAT32)}, "clip.vision.image_mean", "float 0.5"),
    ("std-two", {"clip.vision.image_std": ([0.5, 0.5], T.ARRAY, T.FLOAT32)}, "clip.vision.image_std", "array of 2 float32"),
    ("std-strings", {"clip.vision.image_std": (["a", "b", "c"], T.ARRAY, T.STRING)},
     "clip.vision.image_std", "array of 3 strings"),
    ("silu-array", {"clip.use_silu": ([1], T.ARRAY, T.BOOL)}, "clip.use_silu", "array of 1 bool"),
    ("has-encoder-string", {"clip.has_vision_encoder": ("yes", T.STRING)}, "clip.has_vision_encoder", "string 'yes'"),
    ("image-size-float", {"clip.vision.image_size": (112.0, T.FLOAT32)}, "clip.vision.image_size", "float 112.0"),
    ("eps-huge", {"clip.vision.attention.layer_norm_epsilon": 5.0},
     "clip.vision.attention.layer_norm_epsilon", "float 5.0"),
]


def _expect_refusal(load, path, key, found):
    with pytest.raises(EngineError) as err:
        load(path)
    text = str(err.value)
    assert text.startswith(f"{path}: "), text
    assert f"'{key}'" in text and f"found {found}" in text, text


@pytest.mark.parametrize("name, edit, key, found", TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_wrong_typed_text_metadata_is_refused_naming_the_key(tmp_path, name, edit, key, found):
    _expect_refusal(_load_text, _edited(tmp_path, TEXT, name, set_kv=edit), key, found)


@pytest.mark.parametrize("name, edit, key, found", YARN_CASES, ids=[c[0] for c in YARN_CASES])
def test_wrong_typed_yarn_metadata_is_refused_naming_the_key(tmp_path, name, edit, key, found):
    _expect_refusal(_load_text, _edited(tmp_path, MINISTRAL, name, set_kv=edit), key, found)


@pytest.mark.parametrize("name, edit, key, found", PROJECTOR_CASES, ids=[c[0] for c in PROJECTOR_CASES])
def test_wrong_typed_projector_metadata_is_refused_naming_the_key(tmp_path, name, edit, key, found):
    _expect_refusal(_load_projector, _edited(tmp_path, MMPROJ, name, set_kv=edit), key, found)


# --- counts bounded by the file, checked in O(tensors) ----------------------------------------

@pytest.mark.parametrize("src, key, count, present", [
    (TEXT, "mistral3.block_count", 3, 2), (TEXT, "mistral3.block_count", 2**31, 2),
    (TEXT, "mistral3.block_count", 2**64 - 1, 2), (MMPROJ, "clip.vision.block_count", 4, 3),
    (MMPROJ, "clip.vision.block_count", 2**40, 3),
])
def test_huge_block_count_is_refused_at_once(tmp_path, src, key, count, present):
    """The issue: block_count 2^31 ran for 15 s at 3 GB (and the projector's 2^40 the same).
    Now one pass over the tensor names decides, whatever the claim."""
    path = _edited(tmp_path, src, "blocks", set_kv={key: (count, T.UINT64)})
    t0 = time.perf_counter()
    with open_gguf(path) as gf, pytest.raises(GGUFError) as err:
        text_config(gf) if gf.architecture != "clip" else read_config(gf)
    assert time.perf_counter() - t0 < 1.0
    assert f"'{key}' is {count} but the file holds tensors for {present} blocks" in str(err.value)


def test_fewer_blocks_than_the_file_holds_still_needs_their_shapes(tmp_path):
    """block_count below the tensors present is not a count attack: the shapes decide."""
    path = _edited(tmp_path, TEXT, "one", set_kv={"mistral3.block_count": 1})
    with open_gguf(path) as gf:
        assert text_config(gf).n_layers == 1


@pytest.mark.parametrize("vocab, words", [(4096, "'mistral3.vocab_size' is 4096 but tokenizer.ggml.tokens holds 2048"),
                                          (2**40, "found integer 1099511627776")])
def test_vocab_size_must_equal_the_tokens_array(tmp_path, vocab, words):
    path = _edited(tmp_path, TEXT, "vocab", set_kv={"mistral3.vocab_size": (vocab, T.UINT64)})
    with open_gguf(path) as gf, pytest.raises(GGUFError) as err:
        text_config(gf)
    assert words in str(err.value)


@pytest.mark.parametrize("key, value", [("mistral3.embedding_length", 2**32), ("mistral3.feed_forward_length", 2**31),
                                        ("mistral3.attention.key_length", 2**20)])
def test_dimensions_are_bounded_by_the_tensor_shapes(tmp_path, key, value):
    path = _edited(tmp_path, TEXT, "dims", set_kv={key: (value, T.UINT64)})
    with open_gguf(path) as gf, pytest.raises(GGUFError, match="has shape .* the metadata implies"):
        text_config(gf)


# --- the models folder: a hostile file is listed with its error, the scan goes on -------------

def test_models_folder_lists_hostile_files_with_their_error(tmp_path):
    from tramontane.engine.library.models_folder import scan_models

    folder = tmp_path / "models" / "org__Tiny-GGUF"
    folder.mkdir(parents=True)
    rewrite_gguf(TEXT, folder / "good.gguf")
    rewrite_gguf(TEXT, folder / "name.gguf", set_kv={"general.name": ([1, 2], T.ARRAY, T.UINT8)})
    rewrite_gguf(TEXT, folder / "encoder.gguf", set_kv={"clip.has_vision_encoder": ([1], T.ARRAY, T.UINT8)})
    rewrite_gguf(MMPROJ, folder / "mmproj-bad.gguf", set_kv={"clip.vision.block_count": (2**40, T.UINT64)})
    rewrite_gguf(TEXT, folder / "blocks.gguf", set_kv={"mistral3.block_count": (2**31, T.UINT64)})
    listed = {m.path.name: m for m in scan_models(tmp_path / "models")}
    assert listed["good.gguf"].error is None and listed["blocks.gguf"].error is None  # header reads
    assert "'general.name' should be a string, found array of 2 uint8" in listed["name.gguf"].error
    assert listed["name.gguf"].error.startswith(str(folder / "name.gguf"))
    assert "'clip.has_vision_encoder' should be a bool, found array of 1 uint8" in listed["encoder.gguf"].error
    assert listed["mmproj-bad.gguf"].is_projector and listed["mmproj-bad.gguf"].error is None
    assert listed["good.gguf"].mmproj is None  # the broken projector is never paired


# --- the CLI: one line, exit 2 ----------------------------------------------------------------

@pytest.mark.parametrize("src, name, edit", [
    (TEXT, "eps", {"mistral3.attention.layer_norm_rms_epsilon": ("abc", T.STRING)}),
    (TEXT, "blocks", {"mistral3.block_count": (2**31, T.UINT64)}),
    (TEXT, "template", {"tokenizer.chat_template": (2.0, T.FLOAT32)}),
    (MMPROJ, "ptype", {"clip.vision.block_count": (2**40, T.UINT64)}),
])
def test_cli_info_prints_one_line_and_exits_2(tmp_path, capsys, src, name, edit):
    from tramontane.engine.cli.main import main

    path = _edited(tmp_path, src, name, set_kv=edit)
    assert main(["info", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {path}: "), err


# --- nothing in engine/ reads metadata around the accessor ------------------------------------

RAW_READS = re.compile(r"\b(?:gf|self|reader|kv)\s*\.\s*(?:get|arch)\s*\(\s*[\"'f]"  # gf.get("…"), gf.arch("…")
                       r"|\.kv\s*(?:\[|\.get\s*\()"  # gf.kv[...] / gf.kv.get(...)
                       r"|\bkv\s*(?:\[\s*[\"']|\.get\s*\()")  # a kv dict indexed directly


def test_engine_reads_metadata_only_through_the_typed_accessor():
    offenders = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name == "gguf.py" and path.parent == ENGINE:
            continue  # the accessor itself
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RAW_READS.search(line):
                offenders.append(f"{path.relative_to(ENGINE)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_raw_read_pattern_catches_what_it_should():
    for line in ['x = gf.get("general.name")', "n = gf.arch('block_count')", 'v = kv.get("tokenizer.ggml.pre")',
                 "t = gf.kv['tokenizer.ggml.tokens']", 'bool(kv.get("x", False))']:
        assert RAW_READS.search(line), line
    for line in ['gf.string("general.name")', "self.tensors.get(name)", "os.environ.get('X')"]:
        assert not RAW_READS.search(line), line


def test_fixtures_still_load():
    for path in (TEXT, MINISTRAL):
        _load_text(path)
    _load_projector(MMPROJ)
    assert os.path.exists(TEXT)
