"""Benchmark outputs from records, without a GPU: the study report's arithmetic (against fabricated but
plausible records), the bench table, the PNG chart, the boundary-gap sums, the variant list, the progress
display and the CLI's argument checks."""
import random
import types

import pytest
import torch

from onekernel.bench.chart import bench_chart
from onekernel.bench.progress import progress
from onekernel.bench.report import attribution, bench_table, pivot_table, study_report, us
from onekernel.bench.study import GAP_VARIANTS, WORKERS, boundary_gaps, study_variants
from onekernel.cli import main

META = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "commit": "abc1234", "date": "2026-12-01"}


def _records(seed, batches=(1, 8), fail=()):
    rnd = random.Random(seed)
    recs = []
    for b in batches:
        graph = rnd.uniform(0.5, 2.0) * b ** 0.5
        ms = {"graph": graph, "pdl": graph * rnd.uniform(0.85, 1.2), "pdl-nosplit": graph * rnd.uniform(0.9, 1.3),
              "megakernel": graph * rnd.uniform(1.2, 2.0)}
        ms["megakernel-noprefetch"] = ms["megakernel"] * rnd.uniform(0.95, 1.1)
        ms["megakernel-opevents"] = ms["megakernel"] * rnd.uniform(0.9, 1.3)
        ms["pdl-waittrigger"] = ms["pdl"] * rnd.uniform(0.8, 1.2)
        ms["pdl-entrytrigger"] = ms["pdl"] * rnd.uniform(0.8, 2.0)
        ms["megakernel-covertiles"] = ms["megakernel"] * rnd.uniform(0.9, 1.5)
        ms["megakernel-roundrobin"] = ms["megakernel"] * rnd.uniform(0.9, 1.5)
        ms["megakernel-8warps"] = ms["megakernel"] * rnd.uniform(0.8, 1.3)
        for w in WORKERS:
            ms[f"megakernel-w{w}"] = ms["megakernel"] * rnd.uniform(0.95, 1.6)
        for variant, mode, opts, letters in study_variants(132):
            r = {**META, "model": "llama-3.2-1b", "batch": b, "context": 512, "mode": mode, "variant": variant,
                 "study": letters, "options": opts, "floor_ms": 0.586, "steps": 200, "ms_per_step": ms[variant]}
            if mode == "megakernel":
                r["workers"] = opts.get("n_workers", 132)
            if variant in fail:
                r.update(ms_per_step=None, error="KernelTimeoutError: boom")
            recs.append(r)
        for variant, mode, opts in GAP_VARIANTS:
            n = rnd.randint(100, 200)
            lg = rnd.uniform(50, 200) if mode == "graph" else rnd.uniform(0, 20)
            recs.append({**META, "model": "llama-3.2-1b", "batch": b, "context": 512, "mode": mode,
                         "variant": variant, "study": "e", "options": opts, "profiled": True, "ms_per_step": None,
                         "launch_gaps_us": lg, "ready_gaps_us": lg + rnd.uniform(0, 100), "boundaries": n,
                         "span_us": graph * 1e3 * rnd.uniform(1.0, 1.1)})
    return recs


def _section(report, b):
    part = report.split(f"## llama-3.2-1b, batch {b}\n")[1]
    return part.split("\n## ")[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_study_report_arithmetic_matches_records(seed):
    recs = _records(seed)
    rep = study_report(recs)
    att = attribution(recs)
    for b in (1, 8):
        ms = {r["variant"]: r["ms_per_step"] for r in recs if r["batch"] == b and not r.get("profiled")}
        gaps = {r["variant"]: r for r in recs if r["batch"] == b and r.get("profiled")}
        a = att[("llama-3.2-1b", b)]
        d = lambda x, y: (ms[x] - ms[y]) * 1e3  # noqa: E731
        assert a["pdl_vs_graph"] == pytest.approx(d("pdl", "graph"))
        assert a["split"] + a["overlap_rest"] == pytest.approx(a["pdl_vs_graph"])  # the parts sum to the whole
        assert a["prefetch"] == pytest.approx(d("megakernel", "megakernel-noprefetch"))
        assert a["tile_vs_op_events"] == pytest.approx(d("megakernel", "megakernel-opevents"))
        sec = _section(rep, b)
        for x, y in [("pdl", "graph"), ("pdl", "pdl-nosplit"), ("pdl-nosplit", "graph"),
                     ("megakernel", "megakernel-noprefetch"), ("megakernel", "megakernel-opevents"),
                     ("megakernel", "graph"), ("megakernel", "pdl"), ("pdl-waittrigger", "pdl"),
                     ("pdl-entrytrigger", "pdl"),
                     ("megakernel", "megakernel-covertiles"), ("megakernel", "megakernel-roundrobin"),
                     ("megakernel-8warps", "megakernel")]:
            assert us(d(x, y)) in sec, (x, y)
        # workers table: 132 is the default megakernel, the others their own variant
        assert set(a["workers"]) == set(WORKERS)
        for w in WORKERS:
            t = ms["megakernel" if w == 132 else f"megakernel-w{w}"]
            assert f"| {w} | {t:.3f} | {us((t - ms['megakernel']) * 1e3)} |" in sec
        wt = {w: ms["megakernel" if w == 132 else f"megakernel-w{w}"] for w in WORKERS}
        best = min(wt, key=wt.get)
        assert f"best worker count {best} ({us((wt[best] - ms['megakernel']) * 1e3)} vs the default)" in sec
        g, p = gaps["gaps-graph"], gaps["gaps-pdl"]
        assert (f"graph {g['launch_gaps_us']:.1f} us total over {g['boundaries']} boundaries "
                f"({g['launch_gaps_us'] / g['boundaries']:.2f} us each), pdl {p['launch_gaps_us']:.1f} us") in sec
        rest = ms["graph"] * 1e3 - g["launch_gaps_us"]
        assert f"{rest:.1f} us, which the megakernel exceeds by {us(ms['megakernel'] * 1e3 - rest)}" in sec
    assert "abc1234" in rep and "median of 200" in rep


def test_study_report_with_failed_variants():
    recs = _records(5, batches=(1,), fail=("pdl-nosplit", "megakernel-opevents"))
    recs[-1] = {**recs[-1], "error": "RuntimeError: no profile", "launch_gaps_us": None}
    rep = study_report(recs)
    assert "of which prologue split: not measured" in rep
    assert "tile-level events vs one event per op: not measured" in rep
    assert "pdl-nosplit failed: KernelTimeoutError: boom" in rep
    assert "gaps-pdl-nosplit failed: RuntimeError" in rep
    a = attribution(recs)[("llama-3.2-1b", 1)]
    assert a["split"] is None and a["pdl_vs_graph"] is not None


def _bench_records():
    recs = []
    for b, base in [(1, 2.5), (8, 3.3)]:
        for m, f in [("torch", 4.5), ("torch+graph", 1.0), ("torch+compile", 0.8), ("graph", 0.41),
                     ("megakernel", None)]:
            t = None if f is None else base * f
            recs.append({**META, "model": "llama-3.2-1b", "batch": b, "context": 512, "mode": m, "floor_ms": 0.6,
                         "ms_per_step": t, "tokens_per_s": None if t is None else b * 1e3 / t,
                         "pct_of_floor": None if t is None else 60 / t, "ratio_to_torch_graph": f,
                         **({"error": "DeviceError: x|y"} if t is None else {})})
    return recs


def test_bench_table_and_chart(tmp_path):
    recs = _bench_records()
    table = bench_table(recs)
    assert f"| llama-3.2-1b | 8 | torch+compile | {3.3 * 0.8:.3f} | {8e3 / (3.3 * 0.8):,.0f} | 0.600 |" in table
    assert "0.80x |" in table and "error: DeviceError: x/y" in table
    for key, rs in [("mode", recs), ("variant", _records(3))]:
        path = bench_chart([r for r in rs if not r.get("profiled")], tmp_path / f"{key}.png", key=key)
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert bench_chart([], tmp_path / "empty.png").exists()


def test_boundary_gaps_from_timestamps():
    graph = types.SimpleNamespace(tasks=[types.SimpleNamespace(op=o) for o in (0, 0, 1, 2, 2)])
    # (start, ready, end, sm) in ns: op 1 starts 1 us after op 0 ends, ready 3 us after; op 2 overlaps op 1
    prof = torch.tensor([[0, 0, 5000, 0], [100, 200, 4000, 1], [6000, 8000, 9000, 0],
                         [8500, 9500, 12000, 1], [9200, 9600, 11000, 2]])
    g = boundary_gaps(graph, prof)
    assert g == {"launch_gaps_us": pytest.approx(1.0), "ready_gaps_us": pytest.approx(3.0 + 0.5), "boundaries": 2}


def test_study_variants_cover_every_question():
    v = {name: (mode, opts, letters) for name, mode, opts, letters in study_variants(132)}
    assert v["pdl-nosplit"] == ("pdl", {"prologue_split": False}, "a")
    assert v["pdl-entrytrigger"] == ("pdl", {"trigger": "entry"}, "a")
    assert v["megakernel-noprefetch"][1] == {"prefetch": False} and v["megakernel-opevents"][1] == {"events": "op"}
    assert {k for k in v if k.startswith("megakernel-w")} == {"megakernel-w128", "megakernel-w96", "megakernel-w66"}
    assert "megakernel-w132" in {n for n, *_ in study_variants(114)}
    assert [m for _, m, _ in GAP_VARIANTS] == ["graph", "pdl", "pdl"]


def test_progress_display(capsys):
    with progress(3, "bench tiny") as (started, done):
        for r in _bench_records()[:2] + [_bench_records()[4]]:
            started(f"batch 1: {r['mode']}")
            done(r)
    err = capsys.readouterr().err
    assert "torch+graph" in err and "DeviceError" in err and "3/3" in err


def test_bench_rejects_bad_arguments_before_loading(capsys):
    assert main(["bench", "--model", "tiny", "--random-weights", "--modes", "graph,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(["bench", "--model", "tiny", "--random-weights", "--batch", "1,x"]) == 2
    assert "--batch" in capsys.readouterr().err


def _fake_bench_modes(model, name, batch, context, modes, bw, steps=200, options=None, progress=None,
                      started=None, fill=None):
    recs = []
    for m in modes:
        if started:
            started(m)
        t = 1.0 + 0.1 * len(m) + 0.01 * batch + 0.001 * len(str(options))
        recs.append({"model": name, "batch": batch, "context": context, "fill": context if fill is None else fill,
                     "mode": m, "floor_ms": 0.5,
                     "ms_per_step": t, "tokens_per_s": batch * 1e3 / t, "pct_of_floor": 50 / t, "steps": steps,
                     "ratio_to_torch_graph": None})
        if progress:
            progress(recs[-1])
    return recs


def _fake_gpu(monkeypatch):
    """The bench CLI with its GPU parts faked: tiny random model, fixed copy bandwidth, 132-SM fake GPU."""
    import onekernel.bench.modes
    import onekernel.bench.study
    import onekernel.bench.timing
    import onekernel.cli_tools
    from onekernel.models.load import load_model

    monkeypatch.setattr(onekernel.cli_tools, "_load", lambda args: load_model("tiny", random_weights=True))
    monkeypatch.setattr(onekernel.bench.timing, "copy_bandwidth_gbs", lambda: 4250.0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="FakeGPU", multi_processor_count=132))
    monkeypatch.setattr(onekernel.bench.modes, "bench_modes", _fake_bench_modes)
    monkeypatch.setattr(onekernel.bench.study, "bench_modes", _fake_bench_modes)
    monkeypatch.setattr(onekernel.bench.study, "profile_gaps", lambda model, b, c, mode, opts: {
        "span_us": 900.0, "computing_pct": 50.0, "waiting_pct": 10.0, "idle_pct": 40.0, "launch_gaps_us": 120.0,
        "ready_gaps_us": 200.0, "boundaries": 100, "breakdown_launch_gaps_us": 120.0})


@pytest.mark.parametrize("study", [False, True])
def test_bench_cli_writes_json_markdown_png(tmp_path, monkeypatch, study):
    """The CLI's wiring with the GPU parts faked: files, record keys, progress on stderr."""
    import json

    _fake_gpu(monkeypatch)
    args = ["bench", "--model", "tiny", "--random-weights", "--batch", "1,4", "--out", str(tmp_path)]
    assert main(args + (["--study"] if study else [])) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert [f.rsplit(".", 1)[1] for f in files] == ["json", "md", "png"]
    assert files[0].startswith("study-" if study else "bench-") and "-tiny-" in files[0]
    recs = json.loads((tmp_path / files[0]).read_text())
    for r in recs:
        assert {"model", "batch", "context", "mode", "ms_per_step", "gpu", "torch", "triton", "commit",
                "date"} <= set(r)
        if not r.get("profiled"):
            assert {"floor_ms", "pct_of_floor", "ratio_to_torch_graph"} <= set(r)
    md = (tmp_path / files[1]).read_text()
    if study:
        assert len(recs) == 2 * (len(study_variants(132)) + len(GAP_VARIANTS))
        assert all("variant" in r for r in recs) and md.startswith("# onekernel study")
    else:
        assert {r["mode"] for r in recs} == {"torch", "torch+graph", "torch+compile", "eager", "graph", "pdl",
                                             "megakernel", "megakernel-triton"}
        assert "| tiny | 4 | torch+compile |" in md


def test_bench_fill_reaches_the_records_and_names_the_files(tmp_path, monkeypatch, capsys):
    """--fill N: every record carries the fill and the context it was timed at; the files are named by both (two
    contexts at one fill do not overwrite each other) and the table says the cache's size and fill; a fill above
    the context (the model's, when --context is not given) is refused in one line."""
    import json

    _fake_gpu(monkeypatch)
    fill = random.randint(1, 100)
    for ctx in (128, 256):
        assert main(["bench", "--model", "tiny", "--random-weights", "--batch", "1", "--modes", "graph",
                     "--context", str(ctx), "--fill", str(fill), "--out", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json")
    assert len(files) == 2 and all(f"-fill{fill}" in f for f in files), files
    for f, ctx in zip(files, (128, 256)):
        assert f"-ctx{ctx}-" in f, files
        recs = json.loads((tmp_path / f).read_text())
        assert [(r["context"], r["fill"]) for r in recs] == [(ctx, fill)], recs
        md = (tmp_path / f.replace(".json", ".md")).read_text()
        assert md.startswith(f"KV cache of {ctx} positions, {fill} filled per sequence"), md
    capsys.readouterr()
    assert main(["bench", "--model", "tiny", "--random-weights", "--batch", "1", "--modes", "graph",
                 "--fill", "5000", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--fill must be at most --context" in err and "Traceback" not in err, err


def test_a_second_bench_of_the_same_day_keeps_the_first_ones_files(tmp_path, monkeypatch):
    """Two benches of one model, commit and day with other modes (run 37: a torch.compile row overwrote the table of
    every other mode): the second writes -2 files, the first's records stay as they were."""
    import json

    _fake_gpu(monkeypatch)
    rng = random.Random()
    first, second = rng.sample(["graph", "pdl", "eager", "megakernel"], 2)
    for m in (first, second):
        assert main(["bench", "--model", "tiny", "--random-weights", "--batch", "1", "--modes", m,
                     "--out", str(tmp_path)]) == 0
    jsons = sorted(tmp_path.glob("*.json"), key=lambda p: len(p.name))
    assert len(jsons) == 2 and jsons[1].name == jsons[0].name.replace(".json", "-2.json"), jsons
    assert [[r["mode"] for r in json.loads(p.read_text())] for p in jsons] == [[first], [second]]
    assert len(list(tmp_path.glob("*.md"))) == 2


def test_a_bench_started_while_another_runs_keeps_both(tmp_path, monkeypatch):
    """Run B starts (and finishes) while run A has written no record yet: each keeps its own file (the name is
    reserved when a run starts, not when its first record is written)."""
    import json

    import onekernel.bench.modes

    _fake_gpu(monkeypatch)
    rng = random.Random()
    a, b = rng.sample(["graph", "pdl", "eager", "megakernel"], 2)
    args = ["bench", "--model", "tiny", "--random-weights", "--batch", "1", "--out", str(tmp_path)]
    nested = []

    def overlapping(model, name, batch, *rest, **kw):
        if not nested:
            nested.append(1)
            assert main(args + ["--modes", b]) == 0
        return _fake_bench_modes(model, name, batch, *rest, **kw)
    monkeypatch.setattr(onekernel.bench.modes, "bench_modes", overlapping)
    assert main(args + ["--modes", a]) == 0
    got = sorted([r["mode"] for r in json.loads(p.read_text())] for p in tmp_path.glob("*.json"))
    assert got == sorted([[a], [b]]), got


def test_reserve_stem_skips_every_taken_name(tmp_path):
    """A crashed run's half-written file and earlier reservations are never reused; each call creates its file."""
    from onekernel.bench.report import reserve_stem

    n = random.randint(1, 4)
    (tmp_path / "s.json").write_text('[{"partial": 1}]')
    names = [reserve_stem(tmp_path / "sub", "s") for _ in range(n)] + [reserve_stem(tmp_path, "s")]
    assert names[:n] == ["s"] + [f"s-{i}" for i in range(2, n + 1)] and names[n] == "s-2", names
    assert (tmp_path / "s.json").read_text() == '[{"partial": 1}]'
    assert all((tmp_path / "sub" / f"{x}.json").read_text() == "[]" for x in names[:n])


def test_study_variants_subset_runs_only_those_and_keeps_the_full_files(tmp_path, monkeypatch):
    """--variants: exactly the named variants per batch, in a file of its own (a full study's file stays)."""
    import json

    from onekernel.bench.study import variant_names
    _fake_gpu(monkeypatch)
    rng = random.Random()
    names = variant_names(132)
    pick = rng.sample(names, rng.randint(1, 5))
    (tmp_path / "full").mkdir()
    assert main(["bench", "--model", "tiny", "--random-weights", "--batch", "1,4", "--study",
                 "--out", str(tmp_path / "full")]) == 0
    assert main(["bench", "--model", "tiny", "--random-weights", "--batch", "1,4", "--study",
                 "--variants", ",".join(pick), "--out", str(tmp_path / "full")]) == 0
    jsons = sorted((tmp_path / "full").glob("*.json"), key=lambda p: len(p.name))
    assert len(jsons) == 2
    full, sub = (json.loads(p.read_text()) for p in jsons)
    assert len(full) == 2 * len(names)
    assert sorted((r["batch"], r["variant"]) for r in sub) == sorted((b, v) for b in (1, 4) for v in pick)


@pytest.mark.parametrize("argv, says", [
    (["--study", "--variants", "megakernel,nope"], "nope"),
    (["--variants", "megakernel"], "add --study"),
    (["--variants", ""], "add --study"),
    (["--study", "--variants", ""], "empty"),
    (["--study", "--variants", " , "], "empty"),
])
def test_study_variants_bad_names_fail_before_running(tmp_path, monkeypatch, capsys, argv, says):
    _fake_gpu(monkeypatch)
    ran = []
    monkeypatch.setattr("onekernel.bench.study.run_study", lambda *a, **k: ran.append(1) or [])
    rc = main(["bench", "--model", "tiny", "--random-weights", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and not ran and not list(tmp_path.iterdir())


def test_pivot_table_every_cell_from_its_record():
    """Random records with holes and failures: each cell shows its record's ms (3 decimals below 10 ms, 2 from
    10), "-" for no record, "error" for a failed one; rows in first-seen order; the floor column."""
    rng = random.Random()
    modes = ["torch", "graph", "pdl", "megakernel"]
    recs, want = [], {}
    for model in ("m-a", "m-b"):
        for b in (1, 8):
            floor = rng.uniform(0.05, 5)
            for mode in modes:
                u = rng.random()
                if u < 0.2:
                    want[(model, b, mode)] = "-"
                    continue
                ms = None if u < 0.3 else rng.uniform(0.1, 40)
                recs.append({"model": model, "batch": b, "mode": mode, "ms_per_step": ms, "floor_ms": floor})
                want[(model, b, mode)] = "error" if ms is None else (f"{ms:.3f}" if ms < 10 else f"{ms:.2f}")
            want[(model, b, "floor")] = f"{floor:.3f}"
    rng.shuffle(recs)
    lines = pivot_table(recs, modes).splitlines()
    assert lines[0] == "| model | batch | torch | graph | pdl | megakernel | floor |"
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    assert [(r[0], int(r[1])) for r in rows] == list(dict.fromkeys((r["model"], r["batch"]) for r in recs))
    for r in rows:
        for mode, v in zip(modes + ["floor"], r[2:]):
            assert v == want[(r[0], int(r[1]), mode)], (r, mode)


@pytest.mark.parametrize("argv, says", [
    (["--batch", "0"], "--batch"), (["--batch", "1,99"], "got 99"), (["--steps", "0"], "--steps"),
    (["--context", "1"], "--context"),
])
def test_bench_bad_numbers_name_the_flag(tmp_path, monkeypatch, capsys, argv, says):
    _fake_gpu(monkeypatch)
    rc = main(["bench", "--model", "tiny", "--random-weights", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
    for other in {"--batch", "--steps", "--context"} - {says if says.startswith("--") else "--batch"}:
        assert other not in err
