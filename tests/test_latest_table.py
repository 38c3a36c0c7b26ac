"""scripts/latest_table.py: which record fills each cell of the combined table, on random records."""
from __future__ import annotations

import importlib.util
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "latest_table.py"
RUN3 = REPO / "benchmarks" / "results" / "2026-11-30-run3"
_spec = importlib.util.spec_from_file_location("latest_table", SCRIPT)
lt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lt)


def _rec(rng, model, b, mode, **kw):
    return {"model": model, "batch": b, "mode": mode, "ms_per_step": rng.uniform(0.1, 30), "floor_ms": 1.0,
            "tokens_per_s": 1.0, "pct_of_floor": 1.0,
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


def run(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True)


def write(tmp, name, obj):
    (tmp / name).write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return tmp / name


CASES = {
    "no arguments": lambda t: [],
    "stem only": lambda t: ["out"],
    "missing file": lambda t: ["out", "missing.json"],
    "empty list": lambda t: ["out", write(t, "e.json", [])],
    "not json": lambda t: ["out", write(t, "b.json", "not json")],
    "object": lambda t: ["out", write(t, "o.json", {"a": 1})],
    "non-bench list": lambda t: ["out", write(t, "n.json", [{"foo": 1}])],
    "record missing fields": lambda t: ["out", write(t, "m.json", [{"model": "m", "batch": 1, "mode": "graph",
                                                                    "ms_per_step": 1.0, "floor_ms": 0.5}])],
    "no such out folder": lambda t: [t / "nope" / "out", shutil.copy(RUN3 / "call2-bench-smollm2-135m-f58a972.json", t)],
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, case):
    args = CASES[case](tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-300:])
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_forgotten_stem_does_not_overwrite_an_input(tmp_path):
    a = shutil.copy(RUN3 / "call1-bench-llama-3.1-8b-f645aad.json", tmp_path)
    b = shutil.copy(RUN3 / "call3-bench-qwen3-8b-f58a972.json", tmp_path)
    data = Path(a).read_bytes()
    r = run(a, b, cwd=tmp_path)
    assert r.returncode == 2 and Path(a).read_bytes() == data, r.stderr


def test_good_input_still_works(tmp_path):
    r = run(tmp_path / "lt", RUN3 / "call2-bench-smollm2-135m-f58a972.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(json.loads((tmp_path / "lt.json").read_text())) == 9 and (tmp_path / "lt.md").exists()
