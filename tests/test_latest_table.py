"""scripts/latest_table.py: which record fills each cell of the combined table, on random records."""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("latest_table", Path(__file__).parents[1] / "scripts/latest_table.py")
lt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lt)


def _rec(rng, model, b, mode, **kw):
    return {"model": model, "batch": b, "mode": mode, "ms_per_step": rng.uniform(0.1, 30), "floor_ms": 1.0,
            "ratio_to_torch_graph": None, "commit": "c", **kw}


def test_pick_rules(tmp_path):
    """Later files win; a bench record beats a study record; study variants other than graph/pdl/megakernel
    and a fusedmerge file's onekernel modes are left out; a missing ratio is filled from its own file."""
    rng = random.Random()
    old = [_rec(rng, "m", 1, m) for m in ("torch+graph", "graph", "pdl", "megakernel")]
    study = [_rec(rng, "m", 1, m, variant=v) for m, v in (("graph", "graph"), ("megakernel", "megakernel"),
                                                          ("megakernel", "megakernel-noprefetch"),
                                                          ("torch+graph", "torch+graph"))]
    fused = [_rec(rng, "m", 8, m) for m in ("torch", "torch+graph", "graph")]
    new = [_rec(rng, "m", 1, m) for m in ("torch+graph", "pdl")]
    files = []
    for name, recs in (("a.json", old), ("b-study.json", study), ("c-fusedmerge.json", fused), ("d.json", new)):
        (tmp_path / name).write_text(json.dumps(recs))
        files.append(tmp_path / name)
    got = {(r["batch"], r["mode"]): r for r in lt.pick(files)}
    assert set(got) == {(1, "torch+graph"), (1, "graph"), (1, "pdl"), (1, "megakernel"), (8, "torch"),
                        (8, "torch+graph")}
    assert got[(1, "torch+graph")]["ms_per_step"] == new[0]["ms_per_step"]      # later file
    assert got[(1, "pdl")]["ms_per_step"] == new[1]["ms_per_step"]
    assert got[(1, "graph")]["ms_per_step"] == old[1]["ms_per_step"]            # bench beats a later study
    assert got[(1, "megakernel")]["ms_per_step"] == old[3]["ms_per_step"]
    assert got[(1, "pdl")]["ratio_to_torch_graph"] == pytest.approx(new[1]["ms_per_step"] / new[0]["ms_per_step"])
    assert got[(1, "graph")]["ratio_to_torch_graph"] == pytest.approx(old[1]["ms_per_step"] / old[0]["ms_per_step"])
    assert got[(8, "torch")]["source"].endswith("c-fusedmerge.json")
    assert all("variant" not in r for r in got.values())


def test_study_record_fills_an_empty_cell(tmp_path):
    rng = random.Random()
    s = [_rec(rng, "m", 8, "megakernel", variant="megakernel")]
    (tmp_path / "s.json").write_text(json.dumps(s))
    got, = lt.pick([tmp_path / "s.json"])
    assert got["ms_per_step"] == s[0]["ms_per_step"] and got["ratio_to_torch_graph"] is None


@pytest.mark.parametrize("text, says", [(None, "cannot read"), ("{not json", "cannot read"), ("{}", "not an"),
                                        ('[{"model": "m"}]', "not an")])
def test_bad_files_one_line_nothing_written(tmp_path, text, says):
    p = tmp_path / "in.json"
    if text is not None:
        p.write_text(text)
    with pytest.raises(SystemExit) as e:
        lt.main(str(tmp_path / "out"), [str(p)])
    assert says in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.glob("out*"))
