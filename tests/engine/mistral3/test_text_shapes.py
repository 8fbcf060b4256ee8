"""Other decoder shapes than the fixtures': MHA (no GQA), 4x GQA, tied head, other head sizes,
vocab and depth, YaRN with other parameters — each a random HF model written to GGUF the way
llama.cpp's converter lays it out (Q/K rows permuted per head; proven against the converter's
own output in test_model.py), compared with HF at every position and through the KV cache."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from support.fixture_models import permute_rows  # noqa: E402

from tramontane.engine.mistral3.text import Mistral3Text  # noqa: E402
from tramontane.engine.runtime.decoder import decode, new_cache  # noqa: E402

TOL = 1e-4

VARIANTS = {
    "mha-tied": dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3, head_dim=16,
                     intermediate_size=80, num_hidden_layers=3, vocab_size=300, tie_word_embeddings=True,
                     rope_theta=10000.0),
    "gqa4-wide-heads": dict(hidden_size=32, num_attention_heads=8, num_key_value_heads=2, head_dim=24,
                            intermediate_size=64, num_hidden_layers=2, vocab_size=517,
                            tie_word_embeddings=False, rope_theta=1e9),
    "yarn-other": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                       intermediate_size=96, num_hidden_layers=2, vocab_size=256, tie_word_embeddings=False,
                       rope_theta=1e6, yarn=dict(factor=8.0, original=8, beta_fast=24.0, beta_slow=2.0,
                                                 mscale_all_dim=0.0, beta=0.2)),
}


def _hf_model(v: dict, seed: int):
    from transformers import Ministral3Config, Ministral3ForCausalLM, MistralConfig, MistralForCausalLM

    common = dict(hidden_size=v["hidden_size"], num_attention_heads=v["num_attention_heads"],
                  num_key_value_heads=v["num_key_value_heads"], head_dim=v["head_dim"],
                  intermediate_size=v["intermediate_size"], num_hidden_layers=v["num_hidden_layers"],
                  vocab_size=v["vocab_size"], tie_word_embeddings=v["tie_word_embeddings"], rms_norm_eps=1e-5,
                  sliding_window=None)
    torch.manual_seed(seed)
    if "yarn" in v:
        y = v["yarn"]
        cfg = Ministral3Config(**common, max_position_embeddings=y["original"] * int(y["factor"]),
                               rope_parameters={"rope_type": "yarn", "rope_theta": v["rope_theta"],
                                                "factor": y["factor"], "original_max_position_embeddings": y["original"],
                                                "beta_fast": y["beta_fast"], "beta_slow": y["beta_slow"],
                                                "mscale": 1.0, "mscale_all_dim": y["mscale_all_dim"],
                                                "llama_4_scaling_beta": y["beta"]})
        model = Ministral3ForCausalLM(cfg)
    else:
        cfg = MistralConfig(**common, max_position_embeddings=256,
                            rope_parameters={"rope_type": "default", "rope_theta": v["rope_theta"]})
        model = MistralForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0, 1)
            else:
                p.normal_(0, p.shape[-1] ** -0.5)
    return model.eval(), cfg


def _write_gguf(model, cfg, v: dict, path) -> None:
    """Write the HF weights in llama.cpp's mistral3 layout with gguf-py's writer."""
    import gguf

    arch = "mistral3"
    w = gguf.GGUFWriter(str(path), arch)
    ctx = 256 if "yarn" not in v else v["yarn"]["original"] * int(v["yarn"]["factor"])
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(ctx)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(v["rope_theta"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(cfg.vocab_size)
    if "yarn" in v:
        y = v["yarn"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(y["factor"])
        w.add_rope_scaling_orig_ctx_len(y["original"])
        w.add_rope_scaling_yarn_beta_fast(y["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(y["beta_slow"])
        w.add_rope_scaling_yarn_log_mul(y["mscale_all_dim"])
        w.add_attn_temperature_scale(y["beta"])
    sd = {k: t.detach().float().numpy() for k, t in model.state_dict().items()}
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, ours in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if ours == "attn_q":
                t = permute_rows(t, cfg.num_attention_heads)
            elif ours == "attn_k":
                t = permute_rows(t, cfg.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_shape_variant_matches_hf(tmp_path, name):
    v = VARIANTS[name]
    hf, cfg = _hf_model(v, seed=list(VARIANTS).index(name))
    path = tmp_path / f"{name}.gguf"
    _write_gguf(hf, cfg, v, path)
    model = Mistral3Text.load(path, device="cpu")
    assert model.cfg.tied_embeddings == v["tie_word_embeddings"]
    n = 40 if "yarn" not in v else 60  # past the original context (8) many times over
    ids = torch.randint(0, v["vocab_size"], (n,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids[None]).logits[0]
    ours = model.logits(ids, all_logits=True)
    assert (ours - ref).abs().max().item() < TOL * max(1.0, ref.std().item())
    cache = new_cache(model, 64)
    rows = [model.logits(ids[:20], 0, cache)] + [decode(model, t, cache) for t in ids[20:-1].tolist()]
    # positions 19..n-2; 1e-5 for std-1 logits (the tied variant's are std ~7)
    assert (torch.stack(rows) - ours[19:-1]).abs().max().item() <= 1e-5 * max(1.0, ours.std().item())
