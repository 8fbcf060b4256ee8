"""prefix_keys on its own: positions inside an image span are keyed by the image's content hash too,
and the reusable prefix of a cached sequence never ends inside an image span and always leaves the
prompt's last token to run again (its logits start the reply)."""
from __future__ import annotations

from tramontane.engine.api import ImagePart
from tramontane.engine.mistral3.chat_format import ImageSpan
from tramontane.engine.runtime.prefix_keys import common_prefix, position_keys, reusable_prefix

IMG = 10  # the [IMG] id: equal for every picture of one size


def _span(start, end, data=b"picture one"):
    return ImageSpan(start, end, ImagePart(data, "a.png"), 1, end - start)


def test_position_keys_tag_only_the_image_positions():
    ids = [1, 5, IMG, IMG, IMG, 6, IMG, IMG, 7]
    one, two = _span(2, 5), _span(6, 8, b"picture two")
    keys = position_keys(ids, [one, two])
    assert keys[:2] == [1, 5] and keys[5] == 6 and keys[8] == 7
    assert keys[2:5] == [(IMG, one.image.sha256)] * 3
    assert keys[6:8] == [(IMG, two.image.sha256)] * 2
    assert position_keys(ids, []) == ids
    assert ids == [1, 5, IMG, IMG, IMG, 6, IMG, IMG, 7]  # the caller's list is left alone


def test_two_pictures_of_one_size_share_no_keys():
    ids = [1, IMG, IMG, IMG, 2]
    a = position_keys(ids, [_span(1, 4, b"cat")])
    b = position_keys(ids, [_span(1, 4, b"dog")])
    assert common_prefix(a, b) == 1
    assert common_prefix(a, position_keys(ids, [_span(1, 4, b"cat")])) == 5  # same bytes: same keys


def test_common_prefix():
    assert common_prefix([], [1, 2]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2  # stops at the first difference
    assert common_prefix([(1, "x"), 2], [(1, "y"), 2]) == 0


def test_reusable_prefix_leaves_the_last_prompt_token_to_run():
    prompt = [1, 2, 3, 4]
    assert reusable_prefix([1, 2, 3, 4, 5, 6], prompt, []) == 3  # the cache holds more than the prompt
    assert reusable_prefix(prompt, prompt, []) == 3
    assert reusable_prefix([1, 2, 3], prompt, []) == 3  # the whole cache, one short of the prompt already
    assert reusable_prefix([1, 2], prompt, []) == 2
    assert reusable_prefix([9], prompt, []) == 0
    assert reusable_prefix([1], [1], []) == 0
    assert reusable_prefix([1, 2], [], []) == 0  # never negative


def test_reusable_prefix_never_ends_inside_an_image_span():
    ids = [1, 2, IMG, IMG, IMG, IMG, 3, 4]
    span = _span(2, 6)
    prompt = position_keys(ids, [span])
    for diverge in range(3, 6):  # the cache parts from the prompt inside the image: back to its start
        cached = prompt[:diverge] + [99]
        assert reusable_prefix(cached, prompt, [span]) == 2, diverge
    assert reusable_prefix(prompt[:2] + [99], prompt, [span]) == 2  # at the span's start: kept
    assert reusable_prefix(prompt[:6] + [99], prompt, [span]) == 6  # at its end: the image whole
    assert reusable_prefix(prompt, prompt, [span]) == 7


def test_an_image_ending_the_prompt_is_encoded_again_whole():
    # one short of the whole prompt falls inside a trailing image span: nothing of it is kept
    ids = [1, 2, IMG, IMG, IMG]
    span = _span(2, 5)
    prompt = position_keys(ids, [span])
    assert reusable_prefix(prompt, prompt, [span]) == 2
    assert reusable_prefix(prompt, prompt, [_span(0, 5)]) == 0
