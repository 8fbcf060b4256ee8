"""A target and a ~10x smaller draft model, trained here on the same text, for measuring
speculative decoding's acceptance (issue 38): random weights never agree, so this is the pair
bench/spec*.py measure on.

    python bench/train_pair.py --out /tmp/tramontane-pair [--target-minutes 8 --draft-minutes 2]
    python bench/train_pair.py --out /tmp/tramontane-pair --measure-only      # the pair already there

Text: the Python standard library's own sources and docs (`*.py` of the stdlib folder and
pydoc's topics), on every machine with Python and offline; every 10th file (by name) is held out.
Tokens: the tests' tiny tekken vocabulary (2048 ids, tests/fixtures/mistral3_tiny-f32.gguf) read
by our tokenizer. Models: HF transformers' MistralForCausalLM (the reference nobody here wrote),
trained with AdamW on the CPU for a wall-clock budget each, written as mistral3 F32 GGUF files
(gguf-py's writer; Q/K rows permuted to llama.cpp's layout as its converter does) that the engine
loads; the script checks the engine's logits on a held-out text against HF's before measuring.

Then, with the engine's models and runtime/speculative.py's rule (greedy: verify_greedy over
processed_rows), teacher-forced on the target's own greedy output:
- draft mode on held-out prompts: per k, drafted tokens accepted, the per-token acceptance
  the cost model takes, and tokens a verification yields;
- prompt lookup on a copy task: a held-out passage, then the same passage with an identifier
  renamed, cut after its first line, for the target to continue.
A target trained for minutes loops in its greedy text (the share of repeated 4-grams is
reported), which any drafter predicts; so also, and these are the numbers to quote:
- teacher-forced on the held-out text itself: the draft's argmax against the target's, and
  prompt lookup's one-token draft against the target's argmax (k = 1 acceptance);
- real speculative sampling at temperature 0.7 (verify_sampled with the draft's q, or certain
  lookup drafts on the copy prompts), k = 2 and 4: sampled text does not loop.
Made at bench time, never stored in the repository. Prints one JSON object (and --json FILE).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' support helpers (GGUF fields, Q/K permutation)
from support.fixture_models import permute_rows  # noqa: E402
from support.gguf_edit import _field_value  # noqa: E402  (a field copied as stored)
from tramontane.engine.api import SamplingParams  # noqa: E402
from tramontane.engine.gguf import open_gguf  # noqa: E402
from tramontane.engine.mistral3.text import Mistral3Text  # noqa: E402
from tramontane.engine.mistral3.tokenizer import Tokenizer  # noqa: E402
from tramontane.engine.runtime.decoder import decode, new_cache  # noqa: E402
from tramontane.engine.runtime.speculative import (  # noqa: E402
    PromptLookup, draw, processed_rows, verify_greedy, verify_sampled)

VOCAB_FILE = ROOT / "tests" / "fixtures" / "mistral3_tiny-f32.gguf"
SHAPES = {  # hidden, layers, heads, kv heads, head_dim, ffn
    "target": dict(hidden=192, layers=4, heads=3, kv_heads=1, head_dim=64, ffn=512),
    "draft": dict(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, ffn=192),
}
ROPE_THETA = 10000.0
CONTEXT = 1024
GREEDY = SamplingParams(temperature=0.0)


# ----------------------------------------------------------------------------- text

def corpus_files() -> tuple[list[Path], list[Path]]:
    """(training files, held-out files): the stdlib's top-level sources and pydoc's topics."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py")) + [stdlib / "pydoc_data" / "topics.py"]
    files = [f for f in files if f.is_file()]
    return [f for i, f in enumerate(files) if i % 10], [f for i, f in enumerate(files) if i % 10 == 0]


def encode_files(tok: Tokenizer, files: list[Path]) -> list[list[int]]:
    return [tok.encode(f.read_text(encoding="utf-8", errors="replace")) for f in files]


# ----------------------------------------------------------------------------- training

def hf_model(shape: dict, vocab: int, seed: int):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["ffn"],
                        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                        num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"], rms_norm_eps=1e-5,
                        max_position_embeddings=CONTEXT, sliding_window=None, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    return MistralForCausalLM(cfg)


def train(model, stream: np.ndarray, minutes: float, seq: int, batch: int, lr: float, seed: int) -> dict:
    """AdamW with warm-up and cosine decay over the time budget (the schedule reads the clock)."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    budget, t0, step, losses = minutes * 60.0, time.perf_counter(), 0, []
    while (elapsed := time.perf_counter() - t0) < budget:
        frac = elapsed / budget
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        starts = rng.integers(0, len(stream) - seq - 1, size=batch)
        x = torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts]).astype(np.int64))
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1].clone()).loss  # HF shifts the labels
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
    model.eval()
    return {"steps": step, "tokens": step * batch * seq, "seconds": round(time.perf_counter() - t0, 1),
            "final_loss": round(float(np.mean(losses[-20:])), 3)}


def held_out_loss(model, docs: list[list[int]], seq: int) -> float:
    total, n = 0.0, 0
    with torch.no_grad():
        for ids in docs:
            for s in range(0, len(ids) - seq - 1, seq * 8):
                x = torch.tensor([ids[s:s + seq]])
                total += float(model(input_ids=x, labels=x.clone()).loss) * (seq - 1)
                n += seq - 1
    return round(total / max(n, 1), 3)


# ----------------------------------------------------------------------------- GGUF

def write_gguf(model, shape: dict, path: Path, name: str) -> None:
    """The trained weights as a mistral3 F32 GGUF with the vocabulary file's tokenizer keys."""
    from gguf import GGUFReader, GGUFWriter

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = GGUFWriter(str(path), "mistral3")
    w.add_name(name)
    w.add_uint32("general.file_type", 0)
    for key, value in (("block_count", shape["layers"]), ("context_length", CONTEXT),
                       ("embedding_length", shape["hidden"]), ("feed_forward_length", shape["ffn"]),
                       ("attention.head_count", shape["heads"]), ("attention.head_count_kv", shape["kv_heads"]),
                       ("attention.key_length", shape["head_dim"]), ("attention.value_length", shape["head_dim"]),
                       ("vocab_size", sd["model.embed_tokens.weight"].shape[0]),
                       ("rope.dimension_count", shape["head_dim"])):
        w.add_uint32(f"mistral3.{key}", value)
    w.add_float32("mistral3.rope.freq_base", ROPE_THETA)
    w.add_float32("mistral3.attention.layer_norm_rms_epsilon", 1e-5)
    reader = GGUFReader(VOCAB_FILE)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            value, vtype, sub = _field_value(field)
            w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(shape["layers"]):
        p, h = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(h + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(h + "attn_q.weight", permute_rows(sd[p + "self_attn.q_proj.weight"], shape["heads"]))
        w.add_tensor(h + "attn_k.weight", permute_rows(sd[p + "self_attn.k_proj.weight"], shape["kv_heads"]))
        w.add_tensor(h + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(h + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(h + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(h + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(h + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(h + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_engine_matches_hf(hf, path: Path, ids: list[int]) -> float:
    """Largest |logit| difference, engine on the file against HF on the trained weights."""
    engine = Mistral3Text.load(path, device="cpu")
    ours = engine.logits(ids, 0, new_cache(engine, len(ids), capture_graphs=False), all_logits=True)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0]
    return float((ours.float() - ref).abs().max())


# ----------------------------------------------------------------------------- acceptance

def greedy_continuation(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """The target's n greedy tokens after `prompt`, and the n + 1 rows the plain loop drew them
    from (row t after prompt + out[:t]; the last one after all of them): teacher-forced on its
    own output, these are the rows a speculative run's verification reads."""
    cache = new_cache(model, len(prompt) + n + 1, capture_graphs=False)
    rows = [model.logits(prompt, 0, cache).clone()]
    out: list[int] = []
    for _ in range(n):
        out.append(int(rows[-1].argmax()))
        rows.append(decode(model, out[-1], cache).clone())  # a decode step may reuse its output buffer
    return out, torch.stack(rows)


def speculate(rows: torch.Tensor, prompt: list[int], out: list[int], k: int, propose) -> dict:
    """Replay speculation over the target's greedy output: at each step `propose(t, k)` drafts
    from prompt + out[:t], the rule keeps a prefix and the target's token; `propose.kept(tokens)`
    hears what was kept. Every kept token is checked to be the plain output's."""
    t, steps, drafted, accepted, tried = 0, 0, 0, 0, 0
    while t < len(out):
        drafts = propose(t, min(k, len(out) - t - 1))  # the kept tokens end with the output
        verdict = verify_greedy(processed_rows(rows[t:t + len(drafts) + 1], GREEDY, out[:t], drafts), drafts)
        kept = drafts[:verdict.accepted] + [verdict.token]
        assert kept == out[t:t + len(kept)], "speculation changed the greedy output"
        propose.kept(kept)
        steps += 1
        drafted += len(drafts)
        accepted += verdict.accepted
        tried += verdict.accepted + (1 if verdict.accepted < len(drafts) else 0)
        t += len(kept)
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "tried": tried, "tokens": len(out)}


class DraftModelProposer:
    """Greedy drafts from the draft model, its KV cache cut back to what the target kept."""

    def __init__(self, draft, prompt: list[int], n: int, k: int):
        self.model = draft
        self.cache = new_cache(draft, len(prompt) + n + k + 2, capture_graphs=False)
        self.next_logits = draft.logits(prompt, 0, self.cache)
        self.length = len(prompt)  # tokens of prompt + kept output in the cache

    def __call__(self, t: int, k: int) -> list[int]:
        drafts, logits = [], self.next_logits
        for _ in range(k):
            drafts.append(int(logits.argmax()))
            logits = decode(self.model, drafts[-1], self.cache)
        return drafts

    def kept(self, tokens: list[int]) -> None:
        self.cache.truncate(self.length + len(tokens) - 1)  # the kept drafts' rows stay valid
        self.next_logits = decode(self.model, tokens[-1], self.cache)
        self.length += len(tokens)


class LookupProposer:
    """Prompt lookup over prompt + kept output."""

    def __init__(self, prompt: list[int]):
        self.lookup = PromptLookup(prompt)

    def __call__(self, t: int, k: int) -> list[int]:
        return self.lookup.draft(k)

    def kept(self, tokens: list[int]) -> None:
        self.lookup.extend(tokens)


def summarise(runs: list[dict]) -> dict:
    total = {key: sum(r[key] for r in runs) for key in runs[0]}
    return {"drafted": total["drafted"], "accepted": total["accepted"],
            "accepted_of_drafted": round(total["accepted"] / max(total["drafted"], 1), 4),
            "per_token_acceptance": round(total["accepted"] / max(total["tried"], 1), 4),
            "tokens_per_step": round(total["tokens"] / max(total["steps"], 1), 3)}


# ----------------------------------------------------------------------------- tasks

KEYWORDS = {"self", "def", "return", "import", "from", "class", "for", "while", "not", "and", "None", "True",
            "False", "with", "else", "elif", "try", "except", "raise", "pass", "lambda", "yield", "the"}


def passage_starts(all_lines: list[str]) -> list[int]:
    """The lines where a `def` starts, from a third into the file on (past its imports and
    docstring): where the held-out prompts' passages begin."""
    starts = [i for i, line in enumerate(all_lines) if line.lstrip().startswith("def ")]
    return starts[len(starts) // 3:]


def copy_prompt(text: str, lines: int = 24) -> str | None:
    """A passage of `lines` lines from a `def`, then the same passage with its most frequent
    identifier renamed, cut after its first line: continuing it is copying with a change."""
    all_lines = text.splitlines()
    for start in passage_starts(all_lines):
        passage = "\n".join(all_lines[start:start + lines])
        names = [w for w in re.findall(r"\b[a-z_][a-z_0-9]{3,}\b", passage) if w not in KEYWORDS]
        if len(passage) < 600 or not names:
            continue
        name = max(sorted(set(names)), key=names.count)  # ties: the first by name (a set's order changes per run)
        edited = re.sub(rf"\b{name}\b", name + "_v2", passage)
        return passage + "\n\n# The same, with " + name + " renamed:\n" + edited.splitlines()[0] + "\n"
    return None


def agreement_on_text(target, draft, held_docs: list[list[int]], window: int = 512) -> dict:
    """Teacher-forced on held-out text itself (not on the target's greedy output, which a model
    trained for minutes fills with loops that any drafter predicts): at each position, is the
    draft model's argmax the target's, and is prompt lookup's one-token draft (where it has one)?
    That is the per-token acceptance of k = 1 on natural contexts."""
    same = positions = lookup_hits = lookup_drafts = 0
    for ids in held_docs:
        ids = ids[:window]
        want = target.logits(ids, 0, new_cache(target, len(ids), capture_graphs=False), all_logits=True).argmax(-1)
        got = draft.logits(ids, 0, new_cache(draft, len(ids), capture_graphs=False), all_logits=True).argmax(-1)
        same += int((want == got).sum())
        positions += len(ids)
        lookup = PromptLookup()
        for t, token in enumerate(ids):
            lookup.extend([token])
            guess = lookup.draft(1)
            if guess:
                lookup_drafts += 1
                lookup_hits += int(guess[0] == int(want[t]))
    return {"positions": positions, "draft_argmax_is_target_argmax": round(same / positions, 4),
            "lookup_drafted_share": round(lookup_drafts / positions, 4),
            "lookup_draft_is_target_argmax": round(lookup_hits / max(lookup_drafts, 1), 4)}


def sampled_run(target, draft, prompt: list[int], n: int, k: int, temperature: float, seed: int) -> dict:
    """Real speculative sampling at `temperature` (the loop's own transforms, processed_rows):
    drafts from the draft model (sampled from its q) or, with draft None, from prompt lookup
    (certain drafts), read by the target as k+1 rows of one forward; verify_sampled keeps a
    prefix and draws one token; the KV caches are cut back to it. Sampled text does not loop
    the way a small model's greedy text does."""
    params = SamplingParams(temperature=temperature)
    gen = torch.Generator().manual_seed(seed)
    t_cache = new_cache(target, len(prompt) + n + k + 2, capture_graphs=False)
    target.logits(prompt[:-1], 0, t_cache)
    proposer = SampledDraft(draft, prompt, n + k + 2, params, gen) if draft is not None else None
    lookup = PromptLookup(prompt)
    out, pending, steps, drafted, accepted, tried = [], prompt[-1], 0, 0, 0, 0
    while len(out) < n:
        drafts, q_rows = proposer.draft(out, k) if proposer else (lookup.draft(k), None)
        start = t_cache.length
        rows = target.logits([pending] + drafts, start, t_cache, all_logits=True)
        verdict = verify_sampled(processed_rows(rows, params, out, drafts), drafts, q_rows, gen)
        t_cache.truncate(start + 1 + verdict.accepted)
        kept = drafts[:verdict.accepted] + [verdict.token]
        if proposer:
            proposer.kept(start + 1 + verdict.accepted, verdict.token)
        lookup.extend(kept)
        out += kept
        pending = verdict.token
        steps, drafted, accepted = steps + 1, drafted + len(drafts), accepted + verdict.accepted
        tried += verdict.accepted + (1 if verdict.accepted < len(drafts) else 0)
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "tried": tried, "tokens": len(out), "out": out}


class SampledDraft:
    """The draft model sampling k tokens from its processed distributions q."""

    def __init__(self, draft, prompt: list[int], room: int, params: SamplingParams, gen: torch.Generator):
        self.model, self.params, self.gen = draft, params, gen
        self.cache = new_cache(draft, len(prompt) + room, capture_graphs=False)
        self.logits = draft.logits(prompt, 0, self.cache)

    def draft(self, out: list[int], k: int) -> tuple[list[int], torch.Tensor]:
        drafts, q_rows, logits = [], [], self.logits
        for _ in range(k):
            q_rows.append(processed_rows(logits[None], self.params, out + drafts, [])[0])
            drafts.append(draw(q_rows[-1], self.gen))
            logits = decode(self.model, drafts[-1], self.cache)
        return drafts, torch.stack(q_rows)

    def kept(self, length: int, token: int) -> None:
        self.cache.truncate(length)
        self.logits = decode(self.model, token, self.cache)


def repeated_share(outputs: list[list[int]], n: int = 4) -> float:
    """Share of generated n-grams that occurred earlier in the same output (loops show here)."""
    repeated = total = 0
    for out in outputs:
        seen = set()
        for i in range(len(out) - n + 1):
            gram = tuple(out[i:i + n])
            repeated += gram in seen
            total += 1
            seen.add(gram)
    return round(repeated / max(total, 1), 4)


def measure(target, draft, tok: Tokenizer, held: list[Path], n_prompts: int, gen: int) -> dict:
    results: dict = {"draft_model": {}, "prompt_lookup_plain_text": {}, "prompt_lookup_copy": {}}
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in held]
    plain_prompts = [[tok.bos_id] + tok.encode(t)[:96] for t in texts[:n_prompts]]
    copy_texts = [c for c in (copy_prompt(t) for t in texts) if c][:n_prompts]
    copy_prompts = [[tok.bos_id] + tok.encode(c) for c in copy_texts]
    plain = [(p, *greedy_continuation(target, p, gen)) for p in plain_prompts]
    copies = [(p, *greedy_continuation(target, p, gen)) for p in copy_prompts]
    for k in range(1, 9):
        results["draft_model"][k] = summarise([speculate(rows, p, out, k, DraftModelProposer(draft, p, gen, k))
                                               for p, out, rows in plain])
        results["prompt_lookup_plain_text"][k] = summarise([speculate(rows, p, out, k, LookupProposer(p))
                                                            for p, out, rows in plain])
        results["prompt_lookup_copy"][k] = summarise([speculate(rows, p, out, k, LookupProposer(p))
                                                      for p, out, rows in copies])
    for name, drafter, prompts in (("draft_model", draft, plain_prompts), ("prompt_lookup_copy", None, copy_prompts)):
        for k in (2, 4):
            runs = [sampled_run(target, drafter, p, gen, k, 0.7, seed) for seed, p in enumerate(prompts)]
            entry = results[f"{name}_sampled_t0.7_k{k}"] = summarise([{key: r[key] for key in r if key != "out"}
                                                                     for r in runs])
            entry["repeated_4grams"] = repeated_share([r["out"] for r in runs])
    results["copy_example"] = {"prompt_tail": tok.decode(copy_prompts[0][-60:]), "output": tok.decode(copies[0][1])}
    results["prompts"] = {"held_out": len(plain), "copy": len(copies), "generated_each": gen,
                          "greedy_repeated_4grams": repeated_share([out for _, out, _ in plain]),
                          "copy_repeated_4grams": repeated_share([out for _, out, _ in copies])}
    return results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/tramontane-pair"))
    ap.add_argument("--target-minutes", type=float, default=8.0)
    ap.add_argument("--draft-minutes", type=float, default=2.0)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--measure-only", action="store_true", help="measure the pair already in --out")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    with open_gguf(VOCAB_FILE) as gf:
        tok = Tokenizer.from_gguf(gf)
    train_files, held = corpus_files()
    t0 = time.perf_counter()
    train_docs, held_docs = encode_files(tok, train_files), encode_files(tok, held)
    stream = np.fromiter((t for d in train_docs for t in [tok.bos_id, *d]), dtype=np.int32)
    report = {"corpus": {"train_files": len(train_files), "held_out_files": len(held), "train_tokens": int(stream.size),
                         "held_out_tokens": sum(map(len, held_docs)),
                         "tokenize_s": round(time.perf_counter() - t0, 1)}, "models": {}}
    paths = {role: args.out / f"stdlib-{role}-f32.gguf" for role in SHAPES}
    for role, minutes, lr, seed in (("target", args.target_minutes, 4e-3, 1), ("draft", args.draft_minutes, 4e-3, 2)):
        if args.measure_only:
            break
        model = hf_model(SHAPES[role], tok.vocab_size, seed)
        stats = train(model, stream, minutes, args.seq, args.batch, lr, seed)
        write_gguf(model, SHAPES[role], paths[role], f"stdlib-{role}")
        stats.update(params=sum(p.numel() for p in model.parameters()), shape=SHAPES[role],
                     held_out_loss=held_out_loss(model, held_docs[:6], args.seq),
                     engine_vs_hf_max_logit_diff=check_engine_matches_hf(model, paths[role], held_docs[0][:200]),
                     file=str(paths[role]))
        report["models"][role] = stats
        print(f"{role}: {json.dumps(stats)}", file=sys.stderr, flush=True)
    target, draft = (Mistral3Text.load(paths[r], device="cpu") for r in ("target", "draft"))
    report["acceptance"] = measure(target, draft, tok, held, args.prompts, args.gen)
    report["acceptance"]["teacher_forced_on_text"] = agreement_on_text(target, draft, held_docs[:args.prompts])
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
