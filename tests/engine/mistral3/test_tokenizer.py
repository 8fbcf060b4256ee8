"""Tekken tokenizer from GGUF vs mistral-common's Tekkenizer (tiktoken) on the same vocabulary.

The GGUF fixture was made by llama.cpp's own converter (tests/fixtures/make_tokenizer_fixture.py)
from mistral-common's real 131072-token tekken_240911.json, so ids must match exactly.
"""
from __future__ import annotations

import glob
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from tramontane.engine.api import EngineError
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.tokenizer import TEKKEN_PATTERN, Tokenizer, TokenizerError, TokenType

from support import FIXTURES
from support.tekken_versions import TEKKEN_GGUF, tekken_tokenizer

Tekkenizer = pytest.importorskip("mistral_common.tokens.tokenizers.tekken").Tekkenizer
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

TEKKEN_JSON = MistralTokenizer._data_path() / "tekken_240911.json"
# another engineer's tiny model, converted by llama.cpp from tekken_tiny.json (2048 tokens)
TINY_GGUF = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
TINY_JSON = os.path.join(FIXTURES, "tekken_tiny.json")

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)  # recursion\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n// done\r\n",
    "<div class=\"x\">&nbsp;</div>\n<?php echo $x; ?>",
    "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧‍👦 flag 🏳️‍🌈 🧑🏿‍💻",
    "日本語のテキストです。中文文本，标点符号！한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "Привет, мир! Ελληνικά κείμενα. हिन्दी पाठ। ภาษาไทย",
    "   leading spaces\t\ttabs\n\n\nnewlines   \r\n\r\n  trailing   ",
    " \t \n\t\n  \u00a0\u2003\u3000 \u0085 \u2028x",
    "12345678901234567890 3.14159265358979 1e-10 0x1F -42 1,000,000",
    "https://example.com/path/to?q=tekken&lang=fr#section-2 mailto:a@b.co",
    "[INST] typed by a user [/INST] <s> </s> [IMG] [IMG_BREAK] [SYSTEM_PROMPT] <unk> <pad>",
    "[INST][/INST]<s></s>[IMG]",
    "Mixed: Straße café naïve Ærøskøbing ǅǈǋ ΣΑΣ σς İstanbul",
    "combining: a\u0301 e\u0300 n\u0303 क\u093f",
    "CamelCaseIdentifier snake_case_name SCREAMING_CASE kebab-case",
    "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
    "a" * 300 + " " + "ab" * 100,
    "\x00\x01\x07\x1b[0m control chars \x7f",
    "",
    " ",
    "\n",
]


def _mixed_strings(n: int, seed: int) -> list[str]:
    pools = [
        "abcdefXYZ 0123456789\n\t\r.,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
        "日本語中文한국어ありがとう漢字",
        "مرحبا עברית Привет Ελληνικά",
        "😀👍🏽🇫🇷\u200d🧑💻🌈",
        "\u00a0\u2003\u3000\u0085\u2028\u000b\u000c\u1680\u202f\u205f  \t\n",
        "\u0301\u0308\u0915\u093f\u0e01\u0e34",
        "ǅǈǋΣσςßİı",
        "[INST]<s></s>[IMG]",
    ]
    rng = random.Random(seed)
    return ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 48))) for _ in range(n)]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return tekken_tokenizer()


@pytest.fixture(scope="module")
def ref():
    return Tekkenizer.from_file(TEKKEN_JSON)


def _ref_ids(ref, text: str) -> list[int]:
    return ref.encode(text, bos=False, eos=False)


# ---------------------------------------------------------------------------- the fixture itself
def test_fixture_holds_the_converted_tekken_240911_vocabulary(tok, ref):
    assert os.path.getsize(TEKKEN_GGUF) < 15e6
    with open_gguf(TEKKEN_GGUF) as gf:
        assert gf.kv["tokenizer.ggml.model"] == "gpt2"
        assert gf.kv["tokenizer.ggml.pre"] == "tekken"
        assert not gf.tensors
    assert tok.vocab_size == ref.n_words == 131072
    n_special = ref.num_special_tokens
    assert all(tok.is_control(i) for i in range(n_special))
    assert not any(tok.is_control(i) for i in range(n_special, tok.vocab_size, 97))
    # every ordinary token decodes to exactly the bytes tiktoken holds for it
    for i in range(n_special, tok.vocab_size):
        assert tok.token_bytes(i) == ref.id_to_byte_piece(i), i
    for i in range(n_special):
        assert tok.token_bytes(i) == b""
        assert tok.tokens[i] == ref.id_to_piece(i)


def test_special_ids_and_lookup(tok, ref):
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (ref.bos_id, ref.eos_id, ref.unk_id, ref.pad_id)
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, 11)
    for piece in ["[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "[SYSTEM_PROMPT]",
                  "[/SYSTEM_PROMPT]", "<SPECIAL_999>"]:
        assert tok.token_id(piece) == ref.get_special_token(piece)
        assert tok.is_control(tok.token_id(piece))
    assert tok.token_id("[IMG_BREAK]") == 12
    with pytest.raises(TokenizerError, match="no token '\\[NOPE\\]'") as info:
        tok.token_id("[NOPE]")
    assert TEKKEN_GGUF in str(info.value)
    assert isinstance(info.value, EngineError)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


# ---------------------------------------------------------------------------- encode
@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_encode_matches_mistral_common(tok, ref, text):
    ids = tok.encode(text)
    assert ids == _ref_ids(ref, text)
    assert not any(tok.is_control(i) for i in ids)  # typed "[INST]" or "<s>" stays text


def test_encode_random_mixed_scripts_match(tok, ref):
    texts = _mixed_strings(1500, seed=1234)
    mismatches = [t for t in texts if tok.encode(t) != _ref_ids(ref, t)]
    assert mismatches == []


def test_every_vocabulary_entry_and_random_joins_encode_like_tiktoken(tok, ref):
    # each ordinary token's own text, and texts glued from 2-4 random tokens (exercises merges
    # across pre-token boundaries and rarely reached vocabulary entries)
    rng = random.Random(99)
    texts = []
    for i in range(ref.num_special_tokens, tok.vocab_size):
        try:
            texts.append(tok.token_bytes(i).decode("utf-8"))
        except UnicodeDecodeError:
            pass
    assert len(texts) > 120000
    texts += ["".join(rng.choice(texts) for _ in range(rng.randint(2, 4))) for _ in range(5000)]
    ours = tok._hf.encode_batch(texts, add_special_tokens=False)  # same path as encode(), batched
    mismatches = [t for t, e in zip(texts, ours) if e.ids != _ref_ids(ref, t)]
    assert mismatches == []
    assert tok.encode(texts[-1]) == ours[-1].ids


def test_encode_source_files_match(tok, ref):
    # real-world code and prose: mistral-common's own sources and docs
    root = Path(TEKKEN_JSON).parents[1]
    files = sorted(glob.glob(str(root / "**" / "*.py"), recursive=True))[:25]
    total = 0
    for path in files:
        text = Path(path).read_text(encoding="utf-8")
        ids = tok.encode(text)
        assert ids == _ref_ids(ref, text), path
        total += len(ids)
    assert total > 20000


def test_control_text_typed_by_user_is_ordinary_text(tok):
    ids = tok.encode("[INST]")
    assert tok.token_id("[INST]") not in ids and len(ids) > 1
    assert tok.decode(ids) == "[INST]"
    assert tok.encode("<s>") != [tok.bos_id]


# ---------------------------------------------------------------------------- decode / stream
@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_decode_round_trip_and_stream(tok, ref, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text == ref.decode(ids)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)  # never half a character


def test_stream_holds_back_split_characters(tok):
    # each of these characters is spread over several byte tokens in tekken
    for text in ["😀", "👍🏽", "🇫🇷", "中文", "ภาษาไทย"]:
        ids = tok.encode(text)
        stream = tok.stream()
        pieces = [stream.push(i) for i in ids]
        assert "".join(pieces) + stream.flush() == text
        for piece in pieces:
            assert "\ufffd" not in piece
            piece.encode("utf-8")  # no lone surrogates either
    assert len(tok.encode("😀")) > 1  # the test really splits a character


def test_decode_matches_mistral_common_on_arbitrary_ids(tok, ref):
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        # byte tokens (1000..1255) make invalid UTF-8 likely; sprinkle control tokens
        ids = [int(x) for x in rng.integers(1000, 1256, n)]
        for _ in range(int(rng.integers(0, 3))):
            ids.insert(int(rng.integers(0, len(ids) + 1)), int(rng.integers(0, 20)))
        ids += [int(x) for x in rng.integers(1000, tok.vocab_size, 3)]
        expected = ref.decode(ids, special_token_policy=SpecialTokenPolicy.IGNORE)
        assert tok.decode(ids) == expected
        assert tok.decode(ids, skip_special=False) == ref.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)
        stream = tok.stream()
        assert "".join(stream.push(i) for i in ids) + stream.flush() == expected


def test_piece(tok):
    assert tok.piece(tok.token_id("[INST]")) == "[INST]"
    assert tok.piece(tok.encode(" hello")[0]) == " hello"


# ---------------------------------------------------------------------------- other vocabularies
@pytest.mark.skipif(not (os.path.exists(TINY_GGUF) and os.path.exists(TINY_JSON)),
                    reason="tiny model fixture not built")
def test_tiny_model_vocabulary_matches_its_tekken_json():
    with open_gguf(TINY_GGUF) as gf:
        tiny = Tokenizer.from_gguf(gf)
    ref = Tekkenizer.from_file(TINY_JSON)
    assert tiny.vocab_size == ref.n_words
    for text in CORPUS + _mixed_strings(300, seed=5):
        ids = tiny.encode(text)
        assert ids == _ref_ids(ref, text), text
        assert tiny.decode(ids) == ref.decode(ids) == text


def test_matches_llama_cpp_on_the_same_file(tok, tmp_path):
    """Second, independent reader of the same vocabulary: llama.cpp's own tokenizer, through
    llama-server's /tokenize and /detokenize (tests/support/llama_cpp.py) on the tiny model given
    this file's tokenizer keys. Its tekken regex approximates letter classes and splits combining
    marks (\\p{M}) differently from mistral-common, so only texts without combining marks are
    compared; every token's bytes are compared exactly."""
    import unicodedata

    from support.gguf_edit import with_vocabulary
    from support.llama_cpp import llama_server, llama_server_binary, post_json

    llama_server_binary()  # skip (or fail in CI) before building the model
    model = with_vocabulary(TINY_GGUF, TEKKEN_GGUF, tmp_path / "tiny-tekken_240911.gguf")
    texts = [t for t in CORPUS + _mixed_strings(3000, seed=77)
             if t and not any(unicodedata.category(c).startswith("M") for c in t)]
    assert len(texts) > 500
    with llama_server(model, tmp_path) as url:
        pieces: dict[int, bytes] = {}
        for text in texts:
            answer = post_json(url + "/tokenize", {"content": text, "add_special": False,
                                                   "parse_special": False, "with_pieces": True})
            assert tok.encode(text) == [t["id"] for t in answer["tokens"]], text
            for t in answer["tokens"]:  # a piece that is not UTF-8 comes as its list of bytes
                piece = t["piece"]
                pieces[t["id"]] = piece.encode("utf-8") if isinstance(piece, str) else bytes(piece)
        assert len(pieces) > 400
        assert {i: b for i, b in pieces.items() if tok.token_bytes(i) != b} == {}
        # Random ids beyond the corpus, decoded: compared where the bytes are UTF-8 (the server
        # answers in JSON, which cannot carry the rest).
        rng = random.Random(3)
        decoded = 0
        for _ in range(300):
            ids = [rng.randrange(1000, tok.vocab_size) for _ in range(5)]
            try:
                expected = b"".join(tok.token_bytes(i) for i in ids).decode("utf-8")
            except UnicodeDecodeError:
                continue
            assert post_json(url + "/detokenize", {"tokens": ids})["content"] == expected, ids
            decoded += 1
        assert decoded > 150


def _byte_level(b: bytes) -> str:
    from tramontane.engine.mistral3.tokenizer import _CHAR_TO_BYTE

    to_char = {v: k for k, v in _CHAR_TO_BYTE.items()}
    return "".join(to_char[x] for x in b)


def _synthetic_kv(**override):
    """A small vocab: 3 control tokens, the 256 single bytes, one merge, 3 byte-fallback tokens."""
    tokens = ["<unk>", "<s>", "</s>"] + [_byte_level(bytes([b])) for b in range(256)]
    types = [TokenType.CONTROL] * 3 + [TokenType.NORMAL] * 256
    tokens += [_byte_level(b"ab"), "<0xE4>", "<0xB8>", "<0xAD>"]
    types += [TokenType.NORMAL, TokenType.BYTE, TokenType.BYTE, TokenType.BYTE]
    kv = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "tekken",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    kv.update(override)
    return kv


def test_byte_fallback_tokens_stream_as_one_character():
    tok = Tokenizer.from_kv(_synthetic_kv(), "synthetic.gguf")
    assert tok.encode("abc") == [3 + 256, 3 + ord("c")]
    e4, b8, ad = (tok.token_id(p) for p in ("<0xE4>", "<0xB8>", "<0xAD>"))
    stream = tok.stream()
    assert [stream.push(e4), stream.push(b8), stream.push(ad)] == ["", "", "中"]
    assert tok.decode([e4, b8, ad]) == "中"
    stream.push(e4)
    assert stream.flush() == "\ufffd"  # a cut-off character at the end is reported, not lost
    assert tok.pad_id is None and tok.unk_id == 0


@pytest.mark.parametrize("override, message", [
    ({"tokenizer.ggml.pre": "llama-bpe"}, "tokenizer.ggml.pre is 'llama-bpe'"),
    ({"tokenizer.ggml.pre": None}, "tokenizer.ggml.pre is None"),
    ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model is 'llama'"),
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model is missing"),
    ({"tokenizer.ggml.token_type": None}, "token_type is missing"),
    ({"tokenizer.ggml.token_type": np.ones(5, np.int32)}, "token_type must hold 263"),
    ({"tokenizer.ggml.token_type": np.full(263, 9, np.int32)}, r"token_type\[0\] is 9"),
    ({"tokenizer.ggml.merges": ["a"]}, r"merges\[0\] 'a' is not 'left right'"),
    ({"tokenizer.ggml.merges": ["a zz"]}, "merges do not fit the vocabulary"),
    ({"tokenizer.ggml.merges": None}, "merges is missing"),
    ({"tokenizer.ggml.tokens": []}, "tokens is missing"),
    ({"tokenizer.ggml.bos_token_id": 999}, "bos_token_id = 999 is outside"),
])
def test_bad_tokenizer_data_is_refused_naming_the_file(override, message):
    kv = _synthetic_kv(**override)
    for key in [k for k, v in kv.items() if v is None]:
        del kv[key]
    with pytest.raises(TokenizerError, match=message) as info:
        Tokenizer.from_kv(kv, "/models/broken.gguf")
    assert str(info.value).startswith("/models/broken.gguf: ")


def test_pattern_is_mistral_commons_tekken_pattern():
    cfg = json.loads(Path(TEKKEN_JSON).read_text(encoding="utf-8"))["config"]
    assert TEKKEN_PATTERN == cfg["pattern"]


# ---------------------------------------------------------------------------- CLI
def test_tokenize_main_prints_ids_without_bos(tok, capsys):
    from tramontane.engine.cli.inspect import tokenize_main

    text = "Bonjour 🌍 [INST]"
    assert tokenize_main(TEKKEN_GGUF, text, True) == 0
    assert json.loads(capsys.readouterr().out) == tok.encode(text)
    assert tokenize_main(TEKKEN_GGUF, text, False) == 0
    assert capsys.readouterr().out.split() == [str(i) for i in tok.encode(text)]


def test_tokenize_main_refuses_a_file_without_tekken(tmp_path):
    from tramontane.engine.cli.inspect import tokenize_main

    gguf = pytest.importorskip("gguf")
    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError, match="spm.gguf: tokenizer.ggml.model is 'llama'"):
        tokenize_main(str(path), "x", False)


def test_text_to_id_prefers_control_then_lowest_id():
    # ids 263/264: a control and a byte token whose texts are also ordinary tokens ("a", "b")
    kv = _synthetic_kv()
    kv["tokenizer.ggml.tokens"] = kv["tokenizer.ggml.tokens"] + ["a", "<0x41>", "b"]
    kv["tokenizer.ggml.token_type"] = np.concatenate(
        [kv["tokenizer.ggml.token_type"], np.array([TokenType.CONTROL, TokenType.BYTE, TokenType.UNUSED], np.int32)])
    tok = Tokenizer.from_kv(kv, "synthetic.gguf")
    assert tok.token_id("a") == 263 and tok.is_control(263)  # the control token wins
    assert tok.token_id("b") == 3 + ord("b")  # the ordinary token has the lower id
    assert tok.token_id("<0x41>") == 264 and tok.token_id("<0xE4>") == 260
    assert tok.has_token("ab") and not tok.has_token("zz")
    assert tok.encode("ab") == [3 + 256]  # the BPE vocabulary only holds ordinary tokens


def test_an_ordinary_token_given_twice_is_refused():
    kv = _synthetic_kv()
    kv["tokenizer.ggml.tokens"] = kv["tokenizer.ggml.tokens"] + ["c"]
    kv["tokenizer.ggml.token_type"] = np.append(kv["tokenizer.ggml.token_type"], np.int32(TokenType.NORMAL))
    with pytest.raises(TokenizerError, match=f"token 'c' appears twice \\(ids {3 + ord('c')} and 263\\)"):
        Tokenizer.from_kv(kv, "synthetic.gguf")


def test_vocabulary_is_held_compactly(tok):
    # the file's StringArray, not 131072 str objects; text -> id for the ~1000 controls only
    from tramontane.engine.gguf import StringArray

    assert isinstance(tok.tokens, StringArray)
    assert len(tok._special_pieces) <= 1000 < tok.vocab_size
    assert isinstance(tok._bytes_blob, bytes) and len(tok._bytes_offsets) == tok.vocab_size + 1


def test_a_control_token_wins_over_a_lower_byte_token_with_its_text():
    kv = _synthetic_kv()
    kv["tokenizer.ggml.tokens"] = kv["tokenizer.ggml.tokens"] + ["<0x41>", "<0x41>"]
    kv["tokenizer.ggml.token_type"] = np.concatenate(
        [kv["tokenizer.ggml.token_type"], np.array([TokenType.BYTE, TokenType.CONTROL], np.int32)])
    assert Tokenizer.from_kv(kv, "synthetic.gguf").token_id("<0x41>") == 264
