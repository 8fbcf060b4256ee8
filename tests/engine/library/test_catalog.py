"""The shipped catalogue: every Ministral 3 size the README names, with sizes and shapes the
planner can use, and clear errors for a bad `shape`."""
from __future__ import annotations

import pytest

from tramontane.engine.api import ThinkPart
from tramontane.engine.library.catalog import ModelShape, Sampling, load_catalog, parse_catalog
from tramontane.engine.library.hub import HubError
from tramontane.engine.library.projector import is_projector_name, quant_from_name


def test_the_catalogue_has_ministral_3_3b_8b_14b_with_sizes_and_shapes():
    by_id = {e.id: e for e in load_catalog()}
    # file sizes in bytes as published (see the report: two independent listings agree)
    expected = {"ministral-3-3b-instruct": (2_147_023_008, 26, 3072, True, 841_501_856),
                "ministral-3-8b-instruct": (5_198_911_904, 34, 4096, False, 858_283_168),
                "ministral-3-14b-instruct": (8_239_593_024, 40, 5120, False, 879_258_784)}
    for entry_id, (size, layers, hidden, tied, projector) in expected.items():
        e = by_id[entry_id]
        size_tag = entry_id.split("-")[2].upper()
        assert e.repo_id == f"mistralai/Ministral-3-{size_tag}-Instruct-2512-GGUF"
        (v,) = e.variants
        assert v.file == f"Ministral-3-{size_tag}-Instruct-2512-Q4_K_M.gguf"
        assert v.size_gb == round(size / 1e9, 3)
        assert e.vision and e.mmproj_file == f"Ministral-3-{size_tag}-Instruct-2512-BF16-mmproj.gguf"
        assert e.mmproj_size_gb == round(projector / 1e9, 3)  # the BF16 projector, as published
        assert (e.shape.layers, e.shape.hidden, e.shape.tied) == (layers, hidden, tied)
    for e in by_id.values():  # every entry can be planned before it is downloaded
        assert isinstance(e.shape, ModelShape)
        for v in e.variants:  # a pinned file has its size; an open one is read from the listing
            assert bool(v.file) == bool(v.size_gb)


def _entry(shape):
    return {"models": [{"id": "x", "name": "x", "repo_id": "a/b", "license": "MIT",
                        "variants": [{"quant": "Q4_K_M"}], "shape": shape}]}


def test_a_bad_shape_names_the_field():
    good = {"layers": 2, "hidden": 8, "ffn": 16, "heads": 2, "kv_heads": 1, "head_dim": 4,
            "vocab": 32, "tied": True}
    assert parse_catalog(_entry(good))[0].shape == ModelShape(2, 8, 16, 2, 1, 4, 32, True)
    assert parse_catalog(_entry(None))[0].shape is None
    with pytest.raises(HubError, match=r"models\[0\]\.shape\.ffn: expected a whole number"):
        parse_catalog(_entry({**good, "ffn": "16"}))
    with pytest.raises(HubError, match=r"models\[0\]\.shape\.layers"):
        parse_catalog(_entry({**good, "layers": 0}))
    with pytest.raises(HubError, match=r"models\[0\]\.shape\.tied: expected true or false"):
        parse_catalog(_entry({**good, "tied": 1}))
    with pytest.raises(HubError, match=r"models\[0\]\.shape: expected an object"):
        parse_catalog(_entry([1, 2]))


def test_reasoning_entries_carry_their_chips_sampling_and_thinking_system_prompt():
    """The family's reasoning models (issue 36): the [THINK] template of their shipped system
    prompt is a ThinkPart, so the chat format writes it as the control tokens the model saw."""
    by_id = {e.id: e for e in load_catalog()}
    for entry_id in ("magistral-small-1.2-24b", "ministral-3-8b-reasoning", "ministral-3-14b-reasoning"):
        e = by_id[entry_id]
        assert "reasoning" in e.capabilities
        text, thought, tail = e.system_prompt
        assert text.startswith("# HOW YOU SHOULD THINK AND ANSWER") and isinstance(thought, ThinkPart)
        assert thought.closed and tail == "Here, provide a self-contained response."
    assert by_id["magistral-small-1.2-24b"].sampling == Sampling(0.7, 0.95)
    # 1.2 has a vision encoder; Mistral AI's own GGUF repository leaves it out, Unsloth's ships it
    magistral = by_id["magistral-small-1.2-24b"]
    assert magistral.repo_id == "unsloth/Magistral-Small-2509-GGUF" and magistral.vision
    assert magistral.mmproj_file == "mmproj-F16.gguf" and magistral.mmproj_type == "F16"
    # no reasoning on an instruct model; tools from its card's "native function calling"
    assert by_id["mistral-small-3.1-24b-instruct"].capabilities == ("tools",)


def test_the_rest_of_the_family_small_3_2_devstral_and_ministral_3_3b_reasoning():
    """Issue 36: Mistral Small 3.2 (its card's temperature 0.15, top_p 1), Devstral Small 1.0 (a
    text-only coding agent) and Ministral 3 3B Reasoning (its siblings' thinking system prompt), each
    from a maintained GGUF publisher."""
    by_id = {e.id: e for e in load_catalog()}
    small = by_id["mistral-small-3.2-24b-instruct"]
    assert small.repo_id == "unsloth/Mistral-Small-3.2-24B-Instruct-2506-GGUF" and small.vision
    assert small.capabilities == ("tools",) and small.sampling == Sampling(0.15, 1.0)
    assert small.shape == by_id["mistral-small-3.1-24b-instruct"].shape  # the same 24B network
    dev = by_id["devstral-small-2505-24b"]
    assert dev.repo_id == "bartowski/mistralai_Devstral-Small-2505-GGUF" and not dev.vision
    assert set(dev.capabilities) == {"tools", "coding"}
    r3 = by_id["ministral-3-3b-reasoning"]
    assert r3.repo_id == "unsloth/Ministral-3-3B-Reasoning-2512-GGUF" and r3.vision
    assert set(r3.capabilities) == {"reasoning", "tools"}
    assert r3.system_prompt == by_id["ministral-3-8b-reasoning"].system_prompt
    assert r3.shape == by_id["ministral-3-3b-instruct"].shape


def test_bad_chips_sampling_and_system_prompt_name_the_field():
    def entry(**extra):
        return {"models": [{"id": "x", "name": "x", "repo_id": "a/b", "license": "MIT",
                            "variants": [{"quant": "Q4_K_M"}], **extra}]}

    e = parse_catalog(entry(capabilities=["tools", "coding"], sampling={"temperature": 0.15, "top_p": 1},
                            system_prompt=[{"text": "a"}, {"think": "b"}]))[0]
    assert e.capabilities == ("tools", "coding") and e.sampling == Sampling(0.15, 1.0)
    assert e.system_prompt == ("a", ThinkPart("b"))
    with pytest.raises(HubError, match=r"models\[0\]\.capabilities: expected a list of"):
        parse_catalog(entry(capabilities=["vision"]))
    with pytest.raises(HubError, match=r"models\[0\]\.sampling\.top_p: expected a number from 0.0 to 1.0"):
        parse_catalog(entry(sampling={"temperature": 0.7, "top_p": 1.5}))
    with pytest.raises(HubError, match=r"models\[0\]\.sampling\.temperature"):
        parse_catalog(entry(sampling={"top_p": 0.9}))
    with pytest.raises(HubError, match=r"models\[0\]\.system_prompt\[1\]: expected"):
        parse_catalog(entry(system_prompt=[{"text": "a"}, {"thought": "b"}]))
    with pytest.raises(HubError, match=r"models\[0\]\.system_prompt: expected a non-empty list"):
        parse_catalog(entry(system_prompt="just text"))


def test_devstral_small_1_1_and_magistral_1_1s_shipped_thinking_prompt():
    """Issue 36: Devstral Small 1.1 (2507: v13 calls, text only, from the GGUF repository its card
    names for llama.cpp, with the temperature its card's client example sends) is in the catalogue
    beside 1.0; Magistral Small 1.1 ships the thinking prompt its card moved into the system prompt
    (without 1.2's heading; its thought ends 'Use the same language as the input.'), so a chat on it
    thinks as the model was trained to."""
    by_id = {e.id: e for e in load_catalog()}
    dev = by_id["devstral-small-2507-24b"]
    assert dev.repo_id == "mistralai/Devstral-Small-2507_gguf" and not dev.vision and dev.mmproj_file is None
    assert set(dev.capabilities) == {"tools", "coding"} and dev.shape == by_id["devstral-small-2505-24b"].shape
    assert [v.quant for v in dev.variants] == ["Q4_K_M", "Q8_0"]
    assert dev.sampling == Sampling(0.15, None)  # the card's '"temperature": 0.15', no top_p
    assert dev.system_prompt == ()  # written for the OpenHands scaffold (the row's notes)
    text, thought, tail = by_id["magistral-small-1.1-24b"].system_prompt
    assert text.startswith("First draft your thinking process (inner monologue)")
    assert text.endswith("\n\nYour thinking process must follow the template below:")
    assert isinstance(thought, ThinkPart) and thought.closed
    assert thought.text.endswith("until you are confident to generate the response. Use the same language as the input.")
    assert tail == "Here, provide a self-contained response."
    assert by_id["magistral-small-1.2-24b"].system_prompt[0].startswith("# HOW YOU SHOULD THINK AND ANSWER\n\n")


def test_cards_that_name_a_temperature_without_a_top_p():
    """The Ministral 3 Reasoning cards recommend 'a temperature of 0.7 for most environments' and no
    top_p: the entry pins the temperature alone (top_p None), and a catalogue may say so."""
    by_id = {e.id: e for e in load_catalog()}
    for size in ("3b", "8b", "14b"):
        assert by_id[f"ministral-3-{size}-reasoning"].sampling == Sampling(0.7, None)
    # Mistral Small 3.1's card: "a relatively low temperature, such as temperature=0.15", no top_p
    assert by_id["mistral-small-3.1-24b-instruct"].sampling == Sampling(0.15, None)
    one = {"models": [{"id": "x", "name": "x", "repo_id": "a/b", "license": "MIT",
                       "variants": [{"quant": "Q4_K_M"}], "sampling": {"temperature": 0.3, "top_p": None}}]}
    assert parse_catalog(one)[0].sampling == Sampling(0.3, None)


# Files and sizes in bytes as the repositories list them (issue 36, item 1), each read from public
# listings of that repository's file; the catalogue keeps GB with 3 decimals (bytes / 1e9).
PUBLISHED = {
    ("mistral-small-3.2-24b-instruct", "Q4_K_M"): ("Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf", 14_333_922_848),
    ("mistral-small-3.2-24b-instruct", "Q8_0"): ("Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf", 25_054_793_248),
    ("devstral-small-2507-24b", "Q4_K_M"): ("Devstral-Small-2507-Q4_K_M.gguf", 14_333_915_904),
    ("ministral-3-8b-reasoning", "Q4_K_M"): ("Ministral-3-8B-Reasoning-2512-Q4_K_M.gguf", 5_198_910_368),
    ("ministral-3-14b-reasoning", "Q4_K_M"): ("Ministral-3-14B-Reasoning-2512-Q4_K_M.gguf", 8_239_591_488),
}
PUBLISHED_PROJECTORS = {"mistral-small-3.2-24b-instruct": ("mmproj-F16.gguf", 878_053_568)}
# no published byte size was found for these: the download finds the file in the listing
LISTED_AT_DOWNLOAD = {("magistral-small-1.2-24b", "Q4_K_M"), ("magistral-small-1.2-24b", "Q8_0"),
                      ("magistral-small-1.1-24b", "Q4_K_M"), ("magistral-small-1.1-24b", "Q8_0"),
                      ("devstral-small-2505-24b", "Q4_K_M"), ("devstral-small-2505-24b", "Q8_0"),
                      ("devstral-small-2507-24b", "Q8_0"), ("ministral-3-3b-reasoning", "Q4_K_M")}
# vision models whose repository's projector file no listing named: paired from the listing
PROJECTOR_AT_DOWNLOAD = {"ministral-3-8b-reasoning", "ministral-3-14b-reasoning"}


def test_every_variant_pins_its_file_and_size_in_the_variants_quant():
    """A size the Models dialog can show before anything is asked: every variant pins its file
    (named in the variant's quantization) and size, except those whose size no public listing
    gave, which say so in their notes (the download reads them from the repository listing)."""
    entries = load_catalog()
    open_variants = {(e.id, v.quant) for e in entries for v in e.variants if v.file is None}
    assert open_variants == LISTED_AT_DOWNLOAD
    for e in entries:
        for v in e.variants:
            if (e.id, v.quant) in LISTED_AT_DOWNLOAD:
                assert v.size_gb is None and "read from the repository listing" in e.notes, e.id
                continue
            assert v.file.endswith(".gguf") and quant_from_name(v.file) == v.quant.upper(), (e.id, v.file)
            assert isinstance(v.size_gb, float) and v.size_gb > 0, (e.id, v.quant)
    by_id = {e.id: e for e in entries}
    for (entry_id, quant), (file, size) in PUBLISHED.items():
        v = by_id[entry_id].variant(quant)
        assert (v.file, v.size_gb) == (file, round(size / 1e9, 3))


def test_every_vision_entry_names_its_projector():
    """A vision row downloads the projector its repository ships: its file named (F16 or BF16, as
    the planner sizes its vision tower), or, where no listing named it, notes that say the
    projector is picked from the listing; a text-only row has none."""
    entries = load_catalog()
    assert {e.id for e in entries if e.vision and e.mmproj_file is None} == PROJECTOR_AT_DOWNLOAD
    for e in entries:
        if not e.vision:
            assert e.mmproj_file is None and e.mmproj_size_gb is None, e.id
        elif e.id in PROJECTOR_AT_DOWNLOAD:
            assert "the projector is picked from the repository listing" in e.notes, e.id
        else:
            assert is_projector_name(e.mmproj_file) and e.mmproj_type in ("F16", "BF16"), (e.id, e.mmproj_file)
            assert e.mmproj_size_gb is None or e.mmproj_size_gb > 0
    by_id = {e.id: e for e in entries}
    for entry_id, (file, size) in PUBLISHED_PROJECTORS.items():
        assert (by_id[entry_id].mmproj_file, by_id[entry_id].mmproj_size_gb) == (file, round(size / 1e9, 3))
    assert by_id["magistral-small-1.2-24b"].vision  # its card: "The model now has a vision encoder"
