"""The draft model proposer (runtime/draft.py): the tiny model drafting for itself proposes its own
greedy continuation whatever KV it kept, a draft with another vocabulary is refused naming both
files before its weights are read, a later call reads only the tokens its KV does not hold (rows
counted at the model), three sequences drafted together equal each drafted alone in k passes,
and forgetting, a full pool and a full context leave nothing held or drafted."""
from __future__ import annotations

import pytest

from tramontane.engine.api import EngineError
from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.engine.runtime.draft import DraftModel
from tramontane.engine.runtime.speculative import DraftModelError

from support import FIXTURES
from support.fixture_models import greedy_tokens

TINY = FIXTURES / "mistral3_tiny-f32.gguf"
PROMPT = [1, 1050, 1200, 1300, 1050, 1200, 1300, 1050, 1200]
PROMPTS = ([1, 1500, 1100, 1800, 1033], [1, 1700, 1201, 1010, 1999, 1234, 1400, 1024, 1777, 1300, 1555],
           [1, 1020, 1040])


@pytest.fixture(scope="module")
def target():
    return Mistral3Text.load(TINY, device="cpu")


class RowSpy:
    """Counts the rows and passes of every forward_batch the draft's model runs (prompt chunks and
    decode steps alike go through it)."""

    def __init__(self, drafter: DraftModel, monkeypatch):
        self.rows = self.passes = 0
        real = drafter.model.forward_batch

        def counted(embeds, groups, logits_of):
            self.rows += sum(n for _, _, n in groups)
            self.passes += 1
            return real(embeds, groups, logits_of)

        monkeypatch.setattr(drafter.model, "forward_batch", counted)

    def take(self) -> tuple[int, int]:
        seen, self.rows, self.passes = (self.rows, self.passes), 0, 0
        return seen


def test_the_model_as_its_own_draft_proposes_its_greedy_continuation(target):
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.mistral3.tokenizer import Tokenizer

    plain = greedy_tokens(target, PROMPT, 40)
    with open_gguf(TINY) as gf:
        tokenizer = Tokenizer.from_gguf(gf)
    drafter = DraftModel.load(TINY, tokenizer, positions=256)
    assert drafter.draft([("a", PROMPT, 8)]) == [plain[:8]]
    # steps of a reply: accepted prefixes of every length, then a turn that cuts back into the prompt
    for j, k in ((3, 8), (11, 1), (12, 5), (17, 8), (17, 3), (30, 8), (2, 4), (0, 6)):
        assert drafter.draft([("a", PROMPT + plain[:j], k)]) == [plain[j:j + k]], (j, k)
    other = PROMPT[:5] + [1999, 1024]  # a new turn sharing only part of the prompt
    assert drafter.draft([("a", other, 8)]) == [greedy_tokens(target, other, 8)]
    assert drafter.draft([("a", PROMPT, 0)]) == [[]]


def test_a_draft_with_another_vocabulary_is_refused_naming_both_files(tmp_path, monkeypatch):
    from gguf import GGUFReader
    from support.gguf_edit import rewrite_gguf

    field = GGUFReader(TINY).fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tokens[1500], tokens[1700] = tokens[1700], tokens[1500]
    swapped = rewrite_gguf(TINY, tmp_path / "swapped.gguf", set_kv={"tokenizer.ggml.tokens": tokens})

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights of a refused draft were read")

    monkeypatch.setattr(Mistral3Text, "load", no_weights)
    with pytest.raises(DraftModelError) as refused:
        DraftModel.load(swapped, TINY)
    message = str(refused.value)
    assert message.startswith(f"{swapped} cannot draft for {TINY}: token 1500 is the text "), message
    big = FIXTURES / "tekken_240911_tokenizer.gguf"  # a 131072-token target
    with pytest.raises(DraftModelError, match="their vocabularies hold 2048 and 131072 tokens"):
        DraftModel.load(TINY, big)
    with pytest.raises(EngineError, match="names none"):
        DraftModel.load(TINY, object())


def test_a_later_call_reads_only_the_tokens_its_kv_lacks(target, monkeypatch):
    plain = greedy_tokens(target, PROMPT, 30)
    drafter = DraftModel.load(TINY, TINY, positions=256)
    spy = RowSpy(drafter, monkeypatch)

    assert drafter.draft([("a", PROMPT, 4)]) == [plain[:4]]
    # the prompt but its last token in one chunk, then 4 decode steps (the 4th draft is never read)
    assert spy.take() == (len(PROMPT) + 3, 1 + 4)

    # three drafts were read; the ids go 3 tokens past them: those 3 and the next 3 drafts
    ids = PROMPT + plain[:6]
    assert drafter.draft([("a", ids, 4)]) == [plain[6:10]]
    assert spy.take() == (3 + 3, 1 + 4)

    # ids that end where the draft's reading ended: its next token is known, nothing re-read
    ids = PROMPT + plain[:9]
    assert drafter.draft([("a", ids, 4)]) == [plain[9:13]]
    assert spy.take() == (3, 3)

    # the target corrected the second draft: the KV is cut back to it and only the correction read
    wrong = (plain[10] + 1) % 2048
    ids = PROMPT + plain[:10] + [wrong]
    assert drafter.draft([("a", ids, 4)]) == [greedy_tokens(target, ids, 4)]
    assert spy.take() == (1 + 3, 4)

    # a step with no draft wanted reads nothing and keeps the KV for the next one
    assert drafter.draft([("a", ids + [plain[0]], 0)]) == [[]]
    assert spy.take() == (0, 0) and drafter.keys() == ["a"]

    # a shorter ids list inside what was read (a turn rolled back): its last token is read again
    ids = PROMPT + plain[:4]
    assert drafter.draft([("a", ids, 2)]) == [plain[4:6]]
    assert spy.take() == (1 + 1, 2)


def test_three_sequences_drafted_together_equal_each_alone(target, monkeypatch):
    together = DraftModel.load(TINY, TINY, positions=512)
    alone = DraftModel.load(TINY, TINY, positions=512)
    spy = RowSpy(together, monkeypatch)
    ks = (3, 5, 8)
    ids = [list(p) for p in PROMPTS]
    for turn in range(3):
        requests = [(f"s{i}", ids[i], ks[i]) for i in range(3)]
        batched = together.draft(requests)
        assert batched == [alone.draft([r])[0] for r in requests], turn
        assert batched == [greedy_tokens(target, ids[i], ks[i]) for i in range(3)], turn
        rows, passes = spy.take()
        if turn == 0:  # every prompt in one prefill pass, then max(k) decode steps for all three
            assert (rows, passes) == (sum(len(p) - 1 for p in PROMPTS) + sum(k - 1 for k in ks) + 3, 1 + max(ks))
        else:  # one correction each: one decode pass per step
            assert passes == max(ks), turn
        # the target keeps two drafts and corrects the third (another token)
        for i in range(3):
            ids[i] = ids[i] + batched[i][:2] + [(batched[i][2] + 7) % 2048]


def test_forget_frees_the_blocks_and_close_refuses():
    drafter = DraftModel.load(TINY, TINY, positions=256)
    drafter.draft([("a", PROMPT * 5, 6), ("b", PROMPT, 3)])
    assert drafter.pool.in_use() == 3  # 50 positions in two blocks, 11 in one
    drafter.forget("a")
    assert drafter.pool.in_use() == 1 and drafter.keys() == ["b"]
    drafter.forget("a")  # twice, or a key never drafted: nothing happens
    drafter.forget("never")
    drafter.forget("b")
    assert drafter.pool.in_use() == 0 and drafter.keys() == []
    drafter.draft([("c", PROMPT, 3)])
    pool = drafter.pool
    drafter.close()
    assert pool.in_use() == 0
    with pytest.raises(EngineError, match="closed"):
        drafter.draft([("c", PROMPT, 3)])
    with pytest.raises(ValueError, match="twice"):
        DraftModel.load(TINY, TINY, positions=64).draft([("a", PROMPT, 1), ("a", PROMPT, 2)])


def test_a_retired_sequence_serves_the_next_one_that_shares_its_prefix(target, monkeypatch):
    """A chat's next turn (or the same prompt again) under a new key reads only what the ended
    sequence's KV does not hold; retired KV goes first when a call needs blocks, and close frees it."""
    drafter = DraftModel.load(TINY, TINY, positions=128)  # four blocks of 32
    spy = RowSpy(drafter, monkeypatch)
    first = PROMPT * 3  # 27 ids
    assert drafter.draft([("a", first, 3)]) == [greedy_tokens(target, first, 3)]
    spy.take()
    drafter.retire("a")
    assert drafter.keys() == [] and drafter.retired() == 1 and drafter.pool.in_use() == 1
    turn2 = first + [1100, 1200, 1300]
    assert drafter.draft([("b", turn2, 2)]) == [greedy_tokens(target, turn2, 2)]
    assert spy.take() == (3 + 1, 1 + 2)  # the three new ids (two in a chunk, one decoded), then a draft read
    assert drafter.retired() == 0 and drafter.keys() == ["b"]
    drafter.retire("b")
    other = [1, 1999, 1888, 1777]  # shares only the first token: still taken over, cut back to it
    assert drafter.draft([("c", other, 2)]) == [greedy_tokens(target, other, 2)]
    assert spy.take() == (3 + 1, 1 + 2) and drafter.retired() == 0
    drafter.retire("c")
    long = (PROMPT * 14)[:120]  # 4 blocks: the retired one's block goes to it
    assert drafter.draft([("d", [1999] + long[1:], 2)]) == [greedy_tokens(target, [1999] + long[1:], 2)]
    assert drafter.retired() == 0 and drafter.pool.in_use() == 4
    drafter.retire("d")
    pool = drafter.pool
    drafter.close()
    assert pool.in_use() == 0


def test_a_full_context_or_pool_drafts_less_or_nothing(target):
    drafter = DraftModel.load(TINY, TINY, positions=64)  # two blocks of 32: one sequence's context is 64
    long = (PROMPT * 8)[:62]
    # 62 ids and 3 drafts fill the 64 positions (the last draft is never read); 65 ids fit none
    assert drafter.draft([("a", long, 8)]) == [greedy_tokens(target, long, 3)]
    assert drafter.draft([("a", (PROMPT * 8)[:65], 8)]) == [[]]
    assert drafter.keys() == [] and drafter.pool.in_use() == 0  # the outgrown sequence let go

    short = PROMPT * 2  # 18 ids + 3: one block each
    assert drafter.draft([("a", short, 4)]) == [greedy_tokens(target, short, 4)]
    assert drafter.draft([("b", short, 4)]) == [greedy_tokens(target, short, 4)]
    assert drafter.pool.available() == 0
    # c needs a block: the least recently drafted idle sequence (a) gives its own
    assert drafter.draft([("c", short, 4)]) == [greedy_tokens(target, short, 4)]
    assert drafter.keys() == ["b", "c"]
    # all three at once: a finds no block (b and c are busy), the others draft as before
    assert drafter.draft([("a", short, 4), ("b", short, 4), ("c", short, 4)]) == [
        [], greedy_tokens(target, short, 4), greedy_tokens(target, short, 4)]
    assert drafter.pool.in_use() == 2


@pytest.mark.cpu_variants
def test_a_quantized_draft_on_the_native_kernels(cpu_variant):
    """A Q4_K_M draft for the tiny target (the same vocabulary): the native kernels' batched rows
    draft what each sequence's own greedy decode gives."""
    q4 = FIXTURES / "mistral3_q256-Q4_K_M.gguf"
    model = Mistral3Text.load(q4, device="cpu")
    drafter = DraftModel.load(q4, TINY, positions=512)
    requests = [(i, list(p), 6) for i, p in enumerate(PROMPTS)]
    assert drafter.draft(requests) == [greedy_tokens(model, list(p), 6) for p in PROMPTS], cpu_variant
    longer = [(i, list(p) + [1100, 1200], 6) for i, p in enumerate(PROMPTS)]
    assert drafter.draft(longer) == [greedy_tokens(model, ids, 6) for _, ids, _ in longer], cpu_variant
