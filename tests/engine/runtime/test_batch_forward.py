"""Mistral3Text.forward_batch: rows of several sequences in one pass equal each sequence alone.

References: HF transformers' MistralForCausalLM on the dequantized weights, each sequence run
alone over its whole token list (teacher forcing), and our own one-sequence path (forward /
decode), which other tests tie to HF and llama.cpp. The batch mixes prompt chunks and decode
rows, and sequences join and leave between passes."""
from __future__ import annotations

import pytest
import torch

from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.engine.runtime.decoder import decode, new_cache

from support import FIXTURES

# The batch runs the same arithmetic per row; only the matmul kernels' tiling (one activation
# row vs a tile of rows) may sum in another order: float32 rounding, relative to the logits' size.
BATCH_VS_ALONE_REL = 1e-5
HF_ATOL = 2e-4  # float32 model vs HF float32 (different kernels), logits of size ~4


def _sequences(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _run_batched(model: Mistral3Text, seqs: list[list[int]], schedule: list[list[tuple[int, int]]]):
    """Run `schedule`: per pass, (sequence, rows) pairs; rows feed that sequence's next tokens
    (teacher forcing). Returns every logits row per sequence, in position order."""
    caches = [new_cache(model, 256) for _ in seqs]
    fed = [0] * len(seqs)
    out: list[dict[int, torch.Tensor]] = [{} for _ in seqs]
    for step in schedule:
        ids, groups, rows, who = [], [], [], []
        for s, n in step:
            ids += seqs[s][fed[s]:fed[s] + n]
            groups.append((caches[s], fed[s], n))
            for j in range(n):
                rows.append(len(ids) - n + j)
                who.append((s, fed[s] + j))
            fed[s] += n
        logits = model.forward_batch(model.embed(ids), groups, rows)
        for (s, pos), row in zip(who, logits):
            out[s][pos] = row
    return [torch.stack([o[p] for p in sorted(o)]) for o in out], fed


# Five sequences: prompts read in chunks of different sizes next to decode rows (one row a
# pass); sequence 2 leaves after pass 3, sequences 3 and 4 join at passes 2 and 3.
SCHEDULE = [
    [(0, 16), (1, 23), (2, 7)],
    [(0, 16), (1, 1)],
    [(0, 8), (1, 1), (2, 1), (3, 20)],
    [(1, 1), (2, 1), (3, 10), (4, 12)],
    [(3, 1), (4, 1), (1, 1)],
    [(3, 1), (4, 1), (1, 1)],
]
LENGTHS = [sum(n for step in SCHEDULE for s, n in step if s == k) for k in range(5)]


def _alone(model: Mistral3Text, seq: list[int], n: int, prompt: int):
    """One sequence by itself: all n rows in one pass, and as a chat runs it (the first
    `prompt` rows in one pass, then one decode step per token)."""
    one_pass = model.forward(model.embed(seq[:n]), 0, new_cache(model, 256), all_logits=True)
    cache = new_cache(model, 256)
    stepwise = [model.forward(model.embed(seq[:prompt]), 0, cache)]
    stepwise += [decode(model, t, cache) for t in seq[prompt:n]]
    return one_pass, torch.stack(stepwise)


def _first_chunk(s: int, n: int) -> int:
    return next((rows for k, rows in SCHEDULE[0] if k == s), n)


NAMES = ["mistral3_tiny-f32.gguf", "mistral3_q256-Q4_K_M.gguf", "mistral3_q256-Q6_K.gguf"]


def _batched_and_alone(name):
    """For each sequence of the schedule on model file `name`: (index, its batched logits, the
    same tokens in one pass alone, its decode rows one at a time alone, its first chunk's
    length, the logits' scale)."""
    model = Mistral3Text.load(FIXTURES / name, device="cpu")
    seqs = _sequences(min(model.cfg.vocab_size, 2048), LENGTHS)
    batched, fed = _run_batched(model, seqs, SCHEDULE)
    for s, seq in enumerate(seqs):
        prompt = _first_chunk(s, fed[s])
        one_pass, stepwise = _alone(model, seq, fed[s], prompt)
        yield s, batched[s], one_pass, stepwise, prompt, one_pass.abs().max().item()


@pytest.mark.parametrize("name", NAMES)
def test_batched_rows_equal_each_sequence_alone_at_float32(name, float32_cpu_path):
    """Float32 matmuls: the batch is the same arithmetic as one sequence alone, to rounding."""
    for s, rows, one_pass, stepwise, prompt, scale in _batched_and_alone(name):
        assert (rows - one_pass).abs().max().item() <= BATCH_VS_ALONE_REL * scale, (name, s)
        assert (rows[prompt - 1:] - stepwise).abs().max().item() <= BATCH_VS_ALONE_REL * scale, (name, s)
        assert torch.equal(rows[prompt - 1:].argmax(-1), stepwise.argmax(-1))


@pytest.mark.cpu_variants
@pytest.mark.parametrize("name", NAMES)
def test_batched_rows_on_the_native_kernels_differ_from_alone_only_by_the_kernels_tiles(name, cpu_variant):
    """The native kernels quantize each activation row by itself (the batch cannot mix rows),
    but a pass of several rows runs other tiles than a one-row decode, which sum in another
    order: a sequence alone already differs between its prefill rows and its decode rows by
    that much. A batched row is within 1e-5 of the same row in a one-pass prefill, and no
    further from the one-row decode than that prefill row is."""
    for s, rows, one_pass, stepwise, prompt, scale in _batched_and_alone(name):
        assert (rows - one_pass).abs().max().item() <= BATCH_VS_ALONE_REL * scale, (name, s)
        tiles = (one_pass[prompt - 1:] - stepwise).abs().max().item()
        assert (rows[prompt - 1:] - stepwise).abs().max().item() <= tiles + BATCH_VS_ALONE_REL * scale


def test_batched_rows_equal_hf_transformers_per_sequence():
    transformers = pytest.importorskip("transformers", reason="HF transformers is the reference (test extra)")
    del transformers
    from support.fixture_models import hf_text_model_from_gguf

    path = FIXTURES / "mistral3_tiny-f32.gguf"
    model = Mistral3Text.load(path, device="cpu")
    hf = hf_text_model_from_gguf(path)
    seqs = _sequences(model.cfg.vocab_size, LENGTHS, seed=1)
    batched, fed = _run_batched(model, seqs, SCHEDULE)
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([seq[:fed[s]]])).logits[0]
        assert (batched[s] - ref).abs().max().item() <= HF_ATOL, s
        assert torch.equal(batched[s].argmax(-1), ref.argmax(-1))


def test_bad_groups_are_refused_in_words():
    model = Mistral3Text.load(FIXTURES / "mistral3_tiny-f32.gguf", device="cpu")
    cache = new_cache(model, 16)
    with pytest.raises(Exception, match="cache holds 0 positions"):
        model.forward_batch(model.embed([5, 6]), [(cache, 3, 2)], [1])
    with pytest.raises(Exception, match="input rows"):
        model.forward_batch(model.embed([5, 6, 7]), [(cache, 0, 2)], [1])
    with pytest.raises(Exception, match="context full"):
        model.forward_batch(model.embed(list(range(3, 20))), [(cache, 0, 17)], [16])


def test_the_torch_path_in_float64_equals_each_sequence_alone():
    """A float64 model runs the torch path a GPU runs (RoPE into the cache, sdpa per sequence,
    no native kernel): there the batch is exact to float64 rounding."""
    model = Mistral3Text.load(FIXTURES / "mistral3_tiny-f32.gguf", device="cpu", dtype=torch.float64)
    seqs = _sequences(model.cfg.vocab_size, LENGTHS, seed=2)
    batched, fed = _run_batched(model, seqs, SCHEDULE)
    for s, seq in enumerate(seqs):
        prompt = _first_chunk(s, fed[s])
        one_pass, stepwise = _alone(model, seq, fed[s], prompt)
        scale = one_pass.abs().max().item()  # logits come out as float32: a few of its ulps
        assert (batched[s] - one_pass).abs().max().item() <= 1e-6 * scale
        assert (batched[s][prompt - 1:] - stepwise).abs().max().item() <= 1e-6 * scale
