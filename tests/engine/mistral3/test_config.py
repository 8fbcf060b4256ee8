"""Which files are accepted as Mistral 3, by evidence, and which are refused with a clear reason."""
import os

import numpy as np
import pytest

from support.gguf_edit import rewrite_gguf
from tramontane.engine.cli.main import main as cli_main
from tramontane.engine.gguf import GGUFError, open_gguf
from tramontane.engine.mistral3.config import text_config

from support import FIXTURES
TEXT = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
MINISTRAL = os.path.join(FIXTURES, "ministral3_tiny-f32.gguf")
MMPROJ = os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf")


@pytest.fixture(scope="module")
def llama_copy(tmp_path_factory):
    dst = tmp_path_factory.mktemp("llama") / "llama-labelled.gguf"
    rewrite_gguf(TEXT, dst, rename_arch="llama")
    return dst


def test_mistral3_config_matches_the_hf_model():
    import json

    hf = json.load(open(os.path.join(FIXTURES, "mistral3_tiny", "config.json")))["text_config"]
    with open_gguf(TEXT) as gf:
        cfg = text_config(gf)
    assert cfg.arch == "mistral3"
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab_size) == (
        hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"],
        hf["head_dim"], hf["intermediate_size"], hf["vocab_size"])
    assert cfg.q_width != cfg.hidden
    assert not cfg.tied_embeddings
    assert cfg.rope_scaling is None and cfg.attn_temperature_scale == 0


def test_ministral3_yarn_and_query_scale_are_read():
    import json

    hf = json.load(open(os.path.join(FIXTURES, "ministral3_tiny", "config.json")))
    rope = hf.get("rope_parameters") or hf.get("rope_scaling")
    with open_gguf(MINISTRAL) as gf:
        cfg = text_config(gf)
    assert cfg.rope_scaling == "yarn"
    assert cfg.yarn_factor == pytest.approx(rope["factor"])
    assert cfg.yarn_original_context == rope["original_max_position_embeddings"]
    assert cfg.attn_temperature_scale == pytest.approx(rope["llama_4_scaling_beta"])


def test_llama_labelled_mistral3_is_accepted_with_the_same_config(llama_copy):
    with open_gguf(TEXT) as a, open_gguf(llama_copy) as b:
        ca, cb = text_config(a), text_config(b)
    assert cb.arch == "llama"
    assert {**ca.__dict__, "arch": "llama"} == cb.__dict__


@pytest.mark.parametrize(
    "edit, reason",
    [
        (dict(set_kv={"tokenizer.ggml.pre": "llama-bpe"}), "tokenizer.ggml.pre 'llama-bpe'"),
        (dict(set_kv={"llama.expert_count": 8}), "mixture-of-experts"),
        (dict(add_tensors={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32)}), "mixture-of-experts"),
        (dict(add_tensors={"rope_freqs.weight": np.ones(16, np.float32)}), "rope_freqs"),
        (dict(add_tensors={"blk.0.attn_q_norm.weight": np.ones(32, np.float32)}), "Q/K norms"),
        (dict(set_kv={"llama.rope.scaling.type": "linear"}), "rope.scaling.type 'linear'"),
        (dict(drop_tensors=["blk.0.ffn_gate.weight"]), "ffn_gate"),
    ],
)
def test_llama_neighbours_are_refused(tmp_path, llama_copy, edit, reason):
    dst = tmp_path / "neighbour.gguf"
    rewrite_gguf(llama_copy, dst, **edit)
    with open_gguf(dst) as gf, pytest.raises(GGUFError) as err:
        text_config(gf)
    msg = str(err.value)
    assert msg.startswith(str(dst)) and reason in msg and "'llama'" in msg and "Accepted" in msg


def test_llama_without_control_tokens_is_refused(tmp_path, llama_copy):
    with open_gguf(llama_copy) as gf:
        tokens = list(gf.get("tokenizer.ggml.tokens"))
    tokens[tokens.index("[SYSTEM_PROMPT]")] = "[SYS]"
    dst = tmp_path / "no-sys.gguf"
    rewrite_gguf(llama_copy, dst, set_kv={"tokenizer.ggml.tokens": tokens})
    with open_gguf(dst) as gf, pytest.raises(GGUFError, match=r"lacks \[SYSTEM_PROMPT\]"):
        text_config(gf)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "phi3"])
def test_other_architectures_are_refused_naming_what_was_found(tmp_path, arch):
    dst = tmp_path / f"{arch}.gguf"
    rewrite_gguf(TEXT, dst, rename_arch=arch)
    with open_gguf(dst) as gf, pytest.raises(GGUFError) as err:
        text_config(gf)
    assert f"general.architecture is '{arch}'" in str(err.value) and "mistral3" in str(err.value)


def test_projector_is_not_a_text_model():
    with open_gguf(MMPROJ) as gf, pytest.raises(GGUFError, match="vision projector"):
        text_config(gf)


def test_shape_mismatch_is_refused(tmp_path):
    dst = tmp_path / "bad-shape.gguf"
    rewrite_gguf(TEXT, dst, set_kv={"mistral3.feed_forward_length": 96})
    with open_gguf(dst) as gf, pytest.raises(GGUFError, match="ffn_gate.weight' has shape"):
        text_config(gf)


def test_cli_info_reports_and_refuses(tmp_path, capsys, llama_copy):
    assert cli_main(["info", "--json", TEXT]) == 0
    out = capsys.readouterr().out
    assert '"mistral3 text model"' in out and '"F32"' in out
    assert cli_main(["info", str(llama_copy)]) == 0
    assert "llama-labelled" in capsys.readouterr().out
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    assert cli_main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
