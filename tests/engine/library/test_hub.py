"""Hub access against the loopback fake hub: search, listing with sizes and sha256,
projector pairing, errors in words, offline mode, the shipped catalogue."""
import hashlib
import json

import pytest
from support.fakehub import MODEL_FILE, PROJ_FILE, FakeHub, tiny_repos

from tramontane.engine.library.catalog import load_catalog, parse_catalog, resolve_catalog_entry
from tramontane.engine.library.hub import Hub, HubError, HubFile, pair_projectors
from tramontane.engine.library.projector import quant_from_name


@pytest.fixture
def fake(tmp_path):
    with FakeHub(tiny_repos(tmp_path), tokens={"hf_good"}) as hub:
        yield hub


def test_search_lists_only_gguf_repos_most_downloaded_first(fake):
    hub = Hub(endpoint=fake.endpoint, token=False)
    found = hub.search("gguf")
    assert [r.repo_id for r in found] == ["tiny-org/Tiny-Vision-GGUF",
                                          "tiny-org/Tiny-Gated-GGUF", "other/Text-Only-GGUF"]
    assert found[1].gated and not found[0].gated
    assert [r.repo_id for r in hub.search("tiny-vision")] == ["tiny-org/Tiny-Vision-GGUF"]
    assert hub.search("nothing-like-this") == []


def test_listing_sizes_and_sha256_match_the_bytes(fake):
    hub = Hub(endpoint=fake.endpoint, token=False)
    repo = fake.repos["tiny-org/Tiny-Vision-GGUF"]
    files = {f.path: f for f in hub.list_files("tiny-org/Tiny-Vision-GGUF")}
    assert set(files) == set(repo.files)
    for name, data in repo.files.items():
        assert files[name].size == len(data)
        if name.endswith(".gguf"):
            assert files[name].sha256 == hashlib.sha256(data).hexdigest()
        else:
            assert files[name].sha256 is None  # git-stored: no LFS sha256
    assert {f.path for f in hub.gguf_files("tiny-org/Tiny-Vision-GGUF")} == {
        p for p in repo.files if p.endswith(".gguf")}


def test_model_choices_pair_each_model_with_the_f16_projector(fake):
    hub = Hub(endpoint=fake.endpoint, token=False)
    choices = hub.model_choices("tiny-org/Tiny-Vision-GGUF")
    assert sorted(c.model.path for c in choices) == ["Tiny-Vision-Q4_0.gguf", MODEL_FILE]
    assert all(c.mmproj.path == PROJ_FILE for c in choices)
    repo = fake.repos["tiny-org/Tiny-Vision-GGUF"]
    q8 = next(c for c in choices if c.model.path == MODEL_FILE)
    assert q8.total_size == len(repo.files[MODEL_FILE]) + len(repo.files[PROJ_FILE])
    text = hub.model_choices("other/Text-Only-GGUF")
    assert len(text) == 1 and text[0].mmproj is None


def test_pairing_prefers_projector_in_same_folder():
    f = lambda p: HubFile("r/x", p, 1)  # noqa: E731
    choices = pair_projectors([f("a/m-Q4_K_M.gguf"), f("a/mmproj-q8_0.gguf"),
                               f("b/m-Q8_0.gguf"), f("mmproj-F16.gguf"), f("README.md")])
    by = {c.model.path: c.mmproj.path for c in choices}
    assert by == {"a/m-Q4_K_M.gguf": "a/mmproj-q8_0.gguf", "b/m-Q8_0.gguf": "mmproj-F16.gguf"}


@pytest.mark.parametrize("name,quant", [
    ("mistralai_Mistral-Small-3.1-24B-Instruct-2503-Q4_K_M.gguf", "Q4_K_M"),
    ("mistralai_Mistral-Small-3.1-24B-Instruct-2503-Q8_0.gguf", "Q8_0"),
    ("mmproj-mistralai_Mistral-Small-3.1-24B-Instruct-2503-f16.gguf", "F16"),
    ("Ministral-3-8B-Instruct-2512-UD-IQ4_XS.gguf", "IQ4_XS"),
    ("model-Q5_K_S-00001-of-00003.gguf", "Q5_K_S"),
    ("model.BF16.gguf", "BF16"),
    ("mmproj-F32.gguf", "F32"),
    ("model.gguf", None),
])
def test_quant_from_name(name, quant):
    assert quant_from_name(name) == quant


def test_errors_in_words(fake):
    anon = Hub(endpoint=fake.endpoint, token=False)
    with pytest.raises(HubError) as e:
        anon.remote_file("tiny-org/Tiny-Gated-GGUF", "Tiny-Gated-Q8_0.gguf")
    assert e.value.kind == "gated"
    assert "license" in str(e.value) and "token" in str(e.value)
    wrong = Hub(endpoint=fake.endpoint, token="hf_wrong")
    with pytest.raises(HubError) as e:
        wrong.remote_file("tiny-org/Tiny-Gated-GGUF", "Tiny-Gated-Q8_0.gguf")
    assert e.value.kind == "gated"
    good = Hub(endpoint=fake.endpoint, token="hf_good")
    assert good.remote_file("tiny-org/Tiny-Gated-GGUF", "Tiny-Gated-Q8_0.gguf").size > 0
    with pytest.raises(HubError) as e:
        anon.list_files("nobody/no-such-repo")
    assert e.value.kind == "not_found" and "nobody/no-such-repo" in str(e.value)
    assert "private" in str(e.value)  # anonymous: the hub cannot say which (401)
    with pytest.raises(HubError) as e:
        good.remote_file("nobody/no-such-repo", "x.gguf")
    assert e.value.kind == "not_found" and "404" in str(e.value)
    with pytest.raises(HubError) as e:
        anon.remote_file("tiny-org/Tiny-Vision-GGUF", "missing-Q4_0.gguf")
    assert e.value.kind == "not_found" and "missing-Q4_0.gguf" in str(e.value)


def test_network_down_is_reported_as_network():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    hub = Hub(endpoint=f"http://127.0.0.1:{port}", token=False, timeout=2)
    with pytest.raises(HubError) as e:
        hub.search("x")
    assert e.value.kind == "network" and "reach" in str(e.value)


def test_offline_never_touches_the_network(fake, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = Hub(endpoint=fake.endpoint, token=False)
    for call in (lambda: hub.search("tiny"), lambda: hub.list_files("tiny-org/Tiny-Vision-GGUF"),
                 lambda: hub.remote_file("tiny-org/Tiny-Vision-GGUF", MODEL_FILE)):
        with pytest.raises(HubError) as e:
            call()
        assert e.value.kind == "offline"
    assert fake.requests == []
    assert Hub(endpoint=fake.endpoint, offline=False).offline  # either one switches it on
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert Hub(endpoint=fake.endpoint, offline=True).offline
    assert not Hub(endpoint=fake.endpoint).offline


def test_endpoint_from_environment(fake, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint + "/")
    assert Hub().endpoint == fake.endpoint
    assert Hub(token=False).search("tiny-vision")[0].repo_id == "tiny-org/Tiny-Vision-GGUF"


def test_shipped_catalogue():
    entries = load_catalog()
    small = next(e for e in entries if "Mistral-Small-3.1" in e.repo_id)
    assert small.repo_id == "bartowski/mistralai_Mistral-Small-3.1-24B-Instruct-2503-GGUF"
    assert {v.quant: (v.file, v.size_gb) for v in small.variants} == {
        "Q4_K_M": ("mistralai_Mistral-Small-3.1-24B-Instruct-2503-Q4_K_M.gguf", 14.334),
        "Q8_0": ("mistralai_Mistral-Small-3.1-24B-Instruct-2503-Q8_0.gguf", 25.055)}
    assert small.mmproj_file == "mmproj-mistralai_Mistral-Small-3.1-24B-Instruct-2503-f16.gguf"
    assert small.mmproj_size_gb == 0.878 and small.vision and small.license
    for e in entries:
        assert e.license and e.variants
        for v in e.variants:
            if v.file:  # the file's quant must be the variant's
                assert quant_from_name(v.file) == v.quant.upper()
            if v.memory_gb and v.size_gb:  # memory covers at least weights + projector
                assert v.memory_gb >= v.size_gb + (e.mmproj_size_gb or 0)


def test_catalogue_errors_name_the_field():
    with pytest.raises(HubError, match=r"models\[0\]: missing field 'repo_id'"):
        parse_catalog({"models": [{"id": "x", "name": "x", "license": "x", "variants": []}]})
    with pytest.raises(HubError, match=r"models\[0\].variants"):
        parse_catalog({"models": [{"id": "x", "name": "x", "repo_id": "a/b", "license": "x",
                                   "variants": []}]})
    with pytest.raises(HubError, match="top level"):
        parse_catalog([])


def test_resolve_catalogue_entry_against_the_hub(fake):
    data = {"models": [
        {"id": "pinned", "name": "T", "repo_id": "tiny-org/Tiny-Vision-GGUF", "license": "MIT",
         "vision": True, "variants": [{"quant": "Q8_0", "file": MODEL_FILE}],
         "mmproj": {"file": PROJ_FILE}},
        {"id": "by-quant", "name": "T", "repo_id": "tiny-org/Tiny-Vision-GGUF", "license": "MIT",
         "vision": True, "variants": [{"quant": "Q4_0", "file": None}]},
        {"id": "gone", "name": "T", "repo_id": "tiny-org/Tiny-Vision-GGUF", "license": "MIT",
         "variants": [{"quant": "Q2_K", "file": "gone-Q2_K.gguf"}]},
    ]}
    pinned, by_quant, gone = parse_catalog(json.loads(json.dumps(data)))
    hub = Hub(endpoint=fake.endpoint, token=False)
    r = resolve_catalog_entry(hub, pinned)
    assert (r.model.path, r.mmproj.path) == (MODEL_FILE, PROJ_FILE)
    assert r.model.sha256 == fake.sha256("tiny-org/Tiny-Vision-GGUF", MODEL_FILE)
    r = resolve_catalog_entry(hub, by_quant)
    assert (r.model.path, r.mmproj.path) == ("Tiny-Vision-Q4_0.gguf", PROJ_FILE)
    with pytest.raises(HubError) as e:
        resolve_catalog_entry(hub, gone)
    assert e.value.kind == "not_found" and "gone-Q2_K.gguf" in str(e.value)
    with pytest.raises(HubError, match="no quantization 'Q6_K'"):
        pinned.variant("Q6_K")
