"""`tramontane-cli models ...` against the loopback fake hub."""
import json

import pytest
from support.fakehub import MODEL_FILE, PROJ_FILE, FakeHub, tiny_repos

from tramontane.engine.library.downloads import DownloadRequest, final_path
from tramontane.engine.cli.main import main as cli_main

REPO = "tiny-org/Tiny-Vision-GGUF"


def main(argv: list[str]) -> int:
    return cli_main(["models", *argv])


@pytest.fixture
def fake(tmp_path):
    with FakeHub(tiny_repos(tmp_path / "src"), tokens={"hf_good"}) as hub:
        yield hub


def test_download_list_verify_delete(fake, tmp_path, capsys):
    d = str(tmp_path / "models")
    hub_args = ["--endpoint", fake.endpoint, "--dir", d]
    assert main(["download", REPO, "--quant", "Q8_0", "--quiet", *hub_args]) == 0
    out = capsys.readouterr().out.split()
    model = final_path(d, DownloadRequest(REPO, MODEL_FILE))
    proj = final_path(d, DownloadRequest(REPO, PROJ_FILE))
    assert out == [str(model), str(proj)]
    assert model.read_bytes() == fake.repos[REPO].files[MODEL_FILE]

    assert main(["list", "--json", "--dir", d]) == 0
    listed = json.loads(capsys.readouterr().out)
    by = {f["path"]: f for f in listed["files"]}
    assert by[str(model.resolve())]["quant"] == "Q8_0"
    assert by[str(model.resolve())]["mmproj"] == str(proj.resolve())
    assert by[str(proj.resolve())]["projector"] is True

    assert main(["verify", "--dir", d]) == 0
    assert capsys.readouterr().out.count("sha256 ok") == 2
    data = bytearray(model.read_bytes())
    data[-1] ^= 1  # bit rot in the last tensor
    model.write_bytes(bytes(data))
    assert main(["verify", "--dir", d, str(model)]) == 1
    assert "BAD" in capsys.readouterr().out

    assert main(["delete", "--dir", d, str(model)]) == 0
    assert not model.exists() and proj.exists()


def test_search_and_repo_files(fake, capsys):
    assert main(["search", "tiny", "--endpoint", fake.endpoint]) == 0
    out = capsys.readouterr().out
    assert REPO in out and "tiny-org/Tiny-Gated-GGUF" in out and "gated" in out
    assert main(["search", "--repo", REPO, "--json", "--endpoint", fake.endpoint]) == 0
    choices = json.loads(capsys.readouterr().out)
    assert {c["model"]["path"] for c in choices} == {MODEL_FILE, "Tiny-Vision-Q4_0.gguf"}
    assert all(c["mmproj"]["path"] == PROJ_FILE for c in choices)


def test_errors_are_one_line(fake, tmp_path, capsys):
    d = str(tmp_path / "m")
    assert main(["download", "tiny-org/Tiny-Gated-GGUF", "--file", "Tiny-Gated-Q8_0.gguf",
                 "--quiet", "--endpoint", fake.endpoint, "--dir", d]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "token" in err and "\n" not in err
    assert main(["download", REPO, "--quiet", "--endpoint", fake.endpoint, "--dir", d]) == 2
    assert "--quant" in capsys.readouterr().err  # two models: must choose
    assert main(["download", "no-such-catalogue-id", "--endpoint", fake.endpoint]) == 2
    assert "catalogue id" in capsys.readouterr().err
    before = len(fake.requests)
    assert main(["download", REPO, "--quant", "Q8_0", "--offline", "--dir", d,
                 "--endpoint", fake.endpoint]) == 2
    assert "offline" in capsys.readouterr().err
    assert len(fake.requests) == before  # offline: not one request


def test_catalogue_listing(tmp_path, capsys):
    assert main(["list", "--catalog", "--json", "--dir", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert any(r["file"] == "mistralai_Mistral-Small-3.1-24B-Instruct-2503-Q4_K_M.gguf"
               for r in rows)


def test_registered_in_the_main_cli(fake, tmp_path, capsys):
    from tramontane.engine.cli import main as cli
    assert cli.main(["models", "list", "--dir", str(tmp_path)]) == 0
    assert str(tmp_path) in capsys.readouterr().out


def test_catalogue_listing_says_where_each_entry_would_run(tmp_path, capsys, monkeypatch):
    """What the Models dialog shows, from the same planner: the shipped catalogue on a simulated
    8 GB GPU + 64 GB machine (tests/app/dialogs/test_models.py has the same verdicts), the
    download's size, and no "needs ~? GB" for entries the catalogue gives no memory figure."""
    from tramontane.engine.runtime import device_map
    from tramontane.engine.runtime.device_map import DeviceInfo, Machine

    gib = 1 << 30
    gpu8 = Machine((DeviceInfo("cuda:0", 8 * gib, "simulated 8 GB"),), DeviceInfo("cpu", 64 * gib, "simulated"))
    monkeypatch.setattr(device_map, "detect_machine", lambda: gpu8)
    assert main(["list", "--catalog", "--json", "--dir", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    # entries that pin no size (their files come from the repository's listing at download time)
    # have no size to plan with, and say so
    from tramontane.engine.library.catalog import load_catalog

    unsized = {(r["id"], r["quant"]) for r in rows if r["fits"] is None}
    assert unsized and unsized == {(e.id, v.quant) for e in load_catalog() for v in e.variants if v.size_gb is None}
    fits = {(r["id"], r["quant"]): r["fits"] for r in rows if r["fits"] is not None}
    assert fits == {("mistral-small-3.1-24b-instruct", "Q4_K_M"): "partial",
                    ("mistral-small-3.1-24b-instruct", "Q8_0"): "partial",
                    ("ministral-3-3b-instruct", "Q4_K_M"): "gpu",
                    ("ministral-3-8b-instruct", "Q4_K_M"): "gpu",
                    ("ministral-3-14b-instruct", "Q4_K_M"): "partial",
                    ("mistral-small-3.2-24b-instruct", "Q4_K_M"): "partial",
                    ("mistral-small-3.2-24b-instruct", "Q8_0"): "partial",
                    ("devstral-small-2507-24b", "Q4_K_M"): "partial",
                    ("ministral-3-8b-reasoning", "Q4_K_M"): "gpu",
                    ("ministral-3-14b-reasoning", "Q4_K_M"): "partial"}
    assert main(["list", "--catalog", "--dir", str(tmp_path)]) == 0
    lines = {" ".join(line.split()[:2]): line for line in capsys.readouterr().out.splitlines()}
    assert "15.21 GB  partly on the CPU" in lines["mistral-small-3.1-24b-instruct Q4_K_M"]
    assert "6.06 GB  on the GPU" in lines["ministral-3-8b-instruct Q4_K_M"]  # 5.20 GB + its 0.86 GB projector
    assert "15.21 GB  partly on the CPU" in lines["mistral-small-3.2-24b-instruct Q4_K_M"]  # 14.33 + 0.88 GB
    assert "14.33 GB  partly on the CPU" in lines["devstral-small-2507-24b Q4_K_M"]  # text only
    # a projector the catalogue leaves to the listing is said to be there, its size not guessed
    assert "5.20 GB + projector  on the GPU" in lines["ministral-3-8b-reasoning Q4_K_M"]
    assert all("? (size not known)" in line for key, line in lines.items()
               if tuple(key.split()) in unsized)
    assert not any("?" in line for key, line in lines.items() if tuple(key.split()) not in unsized)
