"""`audit merge OUT SHARD_DIR...`: shard folders of one grid become one run folder; folders that
cannot belong together are refused, naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit import cli
from audit.core import grid, records
from audit.execute.merge import write_records
from audit.plan import shard
from audit.workload import presets
from tests.helpers import cpu_run


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[list[dict], dict]:
    """The stored quick run on 2 cores: its records and run.json."""
    folder = cpu_run("quick", tmp_path_factory.mktemp("stored"))
    return records.read_records(folder), json.loads((folder / "run.json").read_text())


def _shards(stored, root: Path, count: int = 2) -> list[Path]:
    """The stored run cut into `count` shard folders as `run --shard I/N` writes them."""
    recs, info = stored
    preset = presets.presets()["quick"]
    cases = [grid.Case.from_mapping(r) for r in recs]
    by_id = {r["id"]: r for r in recs}
    folders = []
    for index, cells in enumerate(shard.assign(cases, count, shard.cell_costs(cases, preset))):
        folder = root / f"shard{index}"
        folder.mkdir()
        write_records(folder, [by_id[c.id] for c in cells])
        shard_run = dict(info, code_version="0.1.0+git.abc", grid=shard.grid_info(cases, preset),
                         shard=shard.shard_info(shard.Shard(index, count), cells), n_cells=len(cells))
        (folder / "run.json").write_text(json.dumps(shard_run))
        folders.append(folder)
    return folders


def _edit(folder: Path, path: str, value) -> None:
    info = json.loads((folder / "run.json").read_text())
    *parents, last = path.split(".")
    target = info
    for part in parents:
        target = target[part]
    target[last] = value
    (folder / "run.json").write_text(json.dumps(info))


def test_merged_folder_has_every_cell_and_reports(stored, tmp_path, capsys, monkeypatch):
    from audit.render import figures
    monkeypatch.setattr(figures, "FIGURES", ())      # the page, not its PNGs (tests/test_figures.py): 10 CPU-s
    a, b = _shards(stored, tmp_path)
    out = tmp_path / "merged"
    assert cli.main(["merge", str(out), str(a), str(b)]) == 0
    ids = [r["id"] for r in records.read_records(out)]
    assert len(ids) == len(set(ids)) and set(ids) == {r["id"] for r in stored[0]}
    info = json.loads((out / "run.json").read_text())
    assert info["n_cells"] == len(stored[0]) and "shard" not in info
    assert [s["shard"] for s in info["merged"]["shards"]] == ["0/2", "1/2"]
    assert info["merged"]["missing_shards"] == [] and info["merged"]["missing_cells"] == []
    assert (out / "index.md").is_file() and (out / "findings.json").is_file()
    assert f"Cells expected: {len(ids)}; records present: {len(ids)}." in (out / "index.md").read_text()


@pytest.mark.parametrize("field, value", [("env.torch", "2.11.0+cu130"), ("code_version", "0.1.0+git.def"),
                                          ("grid.hash", "0123456789abcdef")])
def test_refuses_a_differing_field_unless_forced(stored, tmp_path, capsys, field, value):
    a, b = _shards(stored, tmp_path)
    original = json.loads((a / "run.json").read_text())
    _edit(b, field, value)
    assert cli.main(["merge", str(tmp_path / "m"), str(a), str(b), "--no-report"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"field {field} differs" in err
    first = original
    for part in field.split("."):
        first = first[part]
    assert repr(first) in err and repr(value) in err and str(b) in err
    assert not (tmp_path / "m").exists(), "a refused merge left a folder"

    assert cli.main(["merge", str(tmp_path / "m"), str(a), str(b), "--no-report", "--force"]) == 0
    info = json.loads((tmp_path / "m" / "run.json").read_text())
    assert len(info["merged"]["forced"]) == 1 and field in info["merged"]["forced"][0]
    assert len(records.read_records(tmp_path / "m")) == len(stored[0])


def test_refuses_a_cell_in_two_shards(stored, tmp_path, capsys):
    a, b = _shards(stored, tmp_path)
    stolen = records.read_records(a)[3]
    with records.RecordWriter(b) as writer:
        writer.write(stolen)
    assert cli.main(["merge", str(tmp_path / "m"), str(a), str(b), "--force"]) == 2
    err = capsys.readouterr().err
    assert stolen["id"] in err and "Traceback" not in err


def test_lists_what_is_missing(stored, tmp_path, capsys):
    a, b = _shards(stored, tmp_path, count=3)[:2]
    lost = records.read_records(b)[-1]["id"]
    kept = [r for r in records.read_records(b) if r["id"] != lost]
    write_records(b, kept)
    assert cli.main(["merge", str(tmp_path / "m"), str(a), str(b), "--no-report"]) == 0
    err = capsys.readouterr().err
    info = json.loads((tmp_path / "m" / "run.json").read_text())
    assert info["merged"]["missing_shards"] == [2] and "missing shards (not given): 2" in err
    assert info["merged"]["missing_cells"] == [lost] and lost in err


def test_refuses_an_out_folder_with_records(stored, tmp_path, capsys):
    a, b = _shards(stored, tmp_path)
    assert cli.main(["merge", str(a), str(b), "--no-report"]) == 2
    assert "already holds records.jsonl" in capsys.readouterr().err
