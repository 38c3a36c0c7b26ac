"""Reports from benchmark records, as pure functions (no GPU): the per-mode table of ``onekernel bench`` and
the markdown report of ``onekernel bench --study``.

The study report states only differences of measured numbers (``bench.study`` records): each cause's share
is the measured difference between two variants that differ in that cause alone, and what the measured
causes do not cover is reported as a remainder, never estimated.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit_id() -> str:
    """The short commit a benchmark record names: $ONEKERNEL_COMMIT first (a tree copied to a GPU machine has no
    or a stale .git), else ``git rev-parse --short HEAD`` of this package's checkout; "" when neither is known."""
    if os.environ.get("ONEKERNEL_COMMIT"):
        return os.environ["ONEKERNEL_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return ""


def reserve_stem(out: Path, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``, ... : the first whose ``.json`` in ``out`` did not exist, created empty
    ("[]") here with an exclusive open, so that a bench of the same day, model and commit started earlier, at the same
    time or left half-written by a crash keeps its files (run 37 lost a table to a later run of the same name).
    Creates ``out``; raises OSError only if ``out`` cannot be written."""
    out.mkdir(parents=True, exist_ok=True)
    name, n = stem, 2
    while True:
        try:
            with open(out / f"{name}.json", "x") as f:
                f.write("[]")
            return name
        except FileExistsError:
            name, n = f"{stem}-{n}", n + 1


def _f(x, fmt=".3f", none="-"):
    return none if x is None else format(x, fmt)


def md_table(headers: list[str], records: list[dict], lead, cells) -> str:
    """A markdown table: ``headers``, then per record ``lead(r)`` (the cells that name the case) and ``cells(r)``
    (the measured ones), or, for a record without ``ms_per_step`` (a case that failed), "error: ..." and empty
    cells. The one table layout of the bench, TP-bench and study reports."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in records:
        name = [str(c) for c in lead(r)]
        if r.get("ms_per_step") is None:
            rest = [f"error: {str(r.get('error', '?'))[:80].replace('|', '/')}"] + [""] * (len(headers) - len(name) - 1)
        else:
            rest = [str(c) for c in cells(r)]
        lines.append("| " + " | ".join(name + rest) + " |")
    return "\n".join(lines)


def bench_table(records: list[dict]) -> str:
    """Markdown table: one row per record (failed modes show their error)."""
    def cells(r):
        ratio = r.get("ratio_to_torch_graph")
        return (f"{r['ms_per_step']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['floor_ms']:.3f}",
                f"{r['pct_of_floor']:.1f}", f"{_f(ratio, '.2f')}{'x' if ratio is not None else ''}")

    return md_table(["model", "batch", "mode", "ms/step", "tokens/s", "floor ms", "% of floor", "vs torch+graph"],
                    records, lambda r: (r["model"], r["batch"], r["mode"]), cells)


def _diff_us(ms: dict, a: str, b: str):
    """(ms[a] - ms[b]) in microseconds, or None when either was not measured."""
    if ms.get(a) is None or ms.get(b) is None:
        return None
    return (ms[a] - ms[b]) * 1e3


def attribution(records: list[dict]) -> dict:
    """Per (model, batch): the measured differences, in microseconds per step (None = not measured).

    pdl_vs_graph = pdl - graph = split + overlap_rest, with split = pdl - pdl-nosplit (the prologue split's
    part) and overlap_rest = pdl-nosplit - graph (PDL's early launch without prologue overlap);
    prefetch = megakernel - megakernel-noprefetch (< 0: prefetch saves); tile_vs_op_events = megakernel -
    megakernel-opevents (< 0: tile-level events are faster); workers: {workers: ms}; mk_vs_graph,
    mk_vs_pdl; gaps: {mode variant: (launch gaps us, ready gaps us, boundaries, span us)};
    graph_minus_gaps_us = graph step - its launch gaps; mk_vs_graph_minus_gaps = megakernel - that.
    """
    out = {}
    for key in sorted({(r["model"], r["batch"]) for r in records}, key=lambda k: (k[0], k[1])):
        rs = [r for r in records if (r["model"], r["batch"]) == key]
        ms = {r["variant"]: r.get("ms_per_step") for r in rs if not r.get("profiled")}
        a = {"ms": ms, "pdl_vs_graph": _diff_us(ms, "pdl", "graph"), "split": _diff_us(ms, "pdl", "pdl-nosplit"),
             "overlap_rest": _diff_us(ms, "pdl-nosplit", "graph"),
             "prefetch": _diff_us(ms, "megakernel", "megakernel-noprefetch"),
             "tile_vs_op_events": _diff_us(ms, "megakernel", "megakernel-opevents"),
             "mk_vs_graph": _diff_us(ms, "megakernel", "graph"), "mk_vs_pdl": _diff_us(ms, "megakernel", "pdl")}
        a["workers"] = {r["workers"]: r.get("ms_per_step") for r in rs
                        if "workers" in r and "d" in r.get("study", "") and not r.get("profiled")
                        and (r["variant"] == "megakernel" or r["variant"].startswith("megakernel-w"))}
        a["gaps"] = {r["variant"]: (r["launch_gaps_us"], r["ready_gaps_us"], r["boundaries"], r["span_us"])
                     for r in rs if r.get("profiled") and r.get("launch_gaps_us") is not None}
        g = a["gaps"].get("gaps-graph")
        a["graph_minus_gaps_us"] = ms["graph"] * 1e3 - g[0] if g and ms.get("graph") is not None else None
        a["mk_vs_graph_minus_gaps"] = (ms["megakernel"] * 1e3 - a["graph_minus_gaps_us"]
                                       if a["graph_minus_gaps_us"] is not None and ms.get("megakernel") is not None
                                       else None)
        out[key] = a
    return out


def us(x) -> str:
    """A signed microsecond figure as the report prints it (tests search the report for these strings)."""
    return "not measured" if x is None else f"{x:+.1f} us"


def _share(part, whole) -> str:
    return f" ({100 * part / whole:.0f}% of it)" if part is not None and whole else ""


def _section(key, a, errors) -> list[str]:
    ms = a["ms"]
    model, batch = key
    L = [f"## {model}, batch {batch}", "", "| variant | ms/step |", "|---|---|"]
    L += [f"| {v} | {_f(t, '.3f', 'error')} |" for v, t in ms.items()]
    L += ["", "**(a) Startup overlap.** "
          f"PDL vs graph: {us(a['pdl_vs_graph'])} per step (pdl {_f(ms.get('pdl'))} ms, graph "
          f"{_f(ms.get('graph'))} ms); of which prologue split: {us(a['split'])}{_share(a['split'], a['pdl_vs_graph'])}"
          f" (pdl with split vs without), and early launch without prologue overlap: {us(a['overlap_rest'])}"
          f"{_share(a['overlap_rest'], a['pdl_vs_graph'])} (pdl without split vs graph). Triggering the dependent "
          f"launch at entry instead of after the body: {us(_diff_us(ms, 'pdl-entrytrigger', 'pdl'))} "
          f"(pdl-entrytrigger {_f(ms.get('pdl-entrytrigger'))} ms); right after the wait: "
          f"{us(_diff_us(ms, 'pdl-waittrigger', 'pdl'))} (pdl-waittrigger {_f(ms.get('pdl-waittrigger'))} ms).", "",
          f"**(b) Prefetch.** megakernel with vs without next-task prefetch: {us(a['prefetch'])} per step "
          f"({'prefetch saves time' if a['prefetch'] is not None and a['prefetch'] < 0 else 'prefetch saves nothing'}"
          f" in this measurement).", "",
          f"**(c) Dependency granularity.** tile-level events vs one event per op: {us(a['tile_vs_op_events'])} "
          f"per step (megakernel {_f(ms.get('megakernel'))} ms, op events {_f(ms.get('megakernel-opevents'))} ms). "
          f"Task size: at most one tile per worker per op vs the separate kernels' tiles: "
          f"{us(_diff_us(ms, 'megakernel', 'megakernel-covertiles'))} (cover tiles "
          f"{_f(ms.get('megakernel-covertiles'))} ms).",
          "", "**(d) Workers.**", "", "| workers | ms/step | vs the default (one per SM) |", "|---|---|---|"]
    base = ms.get("megakernel")
    for w, t in sorted(a["workers"].items(), reverse=True):
        L.append(f"| {w} | {_f(t)} | {us(None if t is None or base is None else (t - base) * 1e3)} |")
    L += ["", f"Critical-path list schedule vs round-robin: {us(_diff_us(ms, 'megakernel', 'megakernel-roundrobin'))}"
          f" (round-robin {_f(ms.get('megakernel-roundrobin'))} ms). 8 warps per worker vs 4: "
          f"{us(_diff_us(ms, 'megakernel-8warps', 'megakernel'))} (8 warps {_f(ms.get('megakernel-8warps'))} ms)."]
    L += ["", "**(e) Launch gaps** (one profiled step; gap = next kernel's first tile start (launch) or body start "
          "(ready) minus this kernel's last tile end, clipped at 0, summed over the kernel boundaries):", "",
          "| mode | launch gaps us | ready gaps us | boundaries | span us |", "|---|---|---|---|---|"]
    for v, (lg, rg, n, span) in a["gaps"].items():
        L.append(f"| {v[5:]} | {lg:.1f} | {rg:.1f} | {n} | {span:.1f} |")
    gg, gp = a["gaps"].get("gaps-graph"), a["gaps"].get("gaps-pdl")
    if gg:
        L += ["", f"Launch gaps: graph {gg[0]:.1f} us total over {gg[2]} boundaries "
              f"({gg[0] / max(gg[2], 1):.2f} us each)" + (f", pdl {gp[0]:.1f} us (ready gaps: graph {gg[1]:.1f} us, "
                                                           f"pdl {gp[1]:.1f} us)." if gp else ".")]
    wbest = min(((t, w) for w, t in a["workers"].items() if t is not None), default=None)
    wtxt = (f", best worker count {wbest[1]} ({us((wbest[0] - base) * 1e3)} vs the default)"
            if wbest and base is not None else "")
    L += ["", f"**Megakernel vs graph:** {us(a['mk_vs_graph'])} per step; vs pdl: {us(a['mk_vs_pdl'])}. "
          f"Measured megakernel-side causes: prefetch (with - without) {us(a['prefetch'])}, tile-level events "
          f"(tile - op) {us(a['tile_vs_op_events'])}{wtxt}. The megakernel has no kernel boundaries; graph's "
          f"step less its measured launch gaps is {_f(a['graph_minus_gaps_us'], '.1f')} us, which the megakernel "
          f"exceeds by {us(a['mk_vs_graph_minus_gaps'])} (in-kernel dependency waits and every other difference "
          "between the two, not split further here).", ""]
    L += [f"- {v} failed: {e[:300]}" for v, e in errors.items()] + ([""] if errors else [])
    return L


def study_report(records: list[dict]) -> str:
    """The markdown report of a study run, generated from its records alone."""
    if not records:
        return "# onekernel study\n\nno records\n"
    r0 = records[0]
    steps = next((r.get("steps") for r in records if r.get("steps")), None)
    L = [f"# onekernel study: {r0['model']}, context {r0['context']}", "",
         f"{r0.get('gpu', '?')}, torch {r0.get('torch', '?')}, triton {r0.get('triton', '?')}, commit "
         f"{r0.get('commit', '?')}, {r0.get('date', '?')}. Step times: median of {steps} CUDA-event-timed steps "
         "after warm-up; gaps: timestamps of one profiled step. Every figure below is measured in this run or a "
         "difference of two measured figures; a negative difference means the first variant is faster.", ""]
    for key, a in attribution(records).items():
        errors = {r["variant"]: r["error"] for r in records
                  if (r["model"], r["batch"]) == key and r.get("error")}
        L += _section(key, a, errors)
    return "\n".join(L)


def fill_ratios(records: list[dict]) -> list[dict]:
    """Set each timed record's missing ``ratio_to_torch_graph`` (a run stopped before computing it) from the
    torch+graph record of its batch in the same run's ``records``; in place, returns ``records``."""
    base = {r["batch"]: r["ms_per_step"] for r in records
            if r["mode"] == "torch+graph" and r.get("ms_per_step") and not r.get("profiled")}
    for r in records:
        if r.get("ratio_to_torch_graph") is None and r.get("ms_per_step") and r["batch"] in base:
            r["ratio_to_torch_graph"] = r["ms_per_step"] / base[r["batch"]]
    return records


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.2f}"


def pivot_table(records: list[dict], modes: list[str]) -> str:
    """Markdown table of ms per step: one row per (model, batch) in first-seen order, one column per mode of
    ``modes``, then the floor; "-" where no record has that cell, "error" where its mode failed."""
    rows = list(dict.fromkeys((r["model"], r["batch"]) for r in records))
    cell = {(r["model"], r["batch"], r["mode"]): r for r in records}
    lines = ["| model | batch | " + " | ".join(modes) + " | floor |", "|---|---|" + "---|" * (len(modes) + 1)]
    for m, b in rows:
        vals = []
        for mode in modes:
            r = cell.get((m, b, mode))
            vals.append("-" if r is None else "error" if r.get("ms_per_step") is None else _ms(r["ms_per_step"]))
        floor = next((r["floor_ms"] for r in records if (r["model"], r["batch"]) == (m, b) and r.get("floor_ms")),
                     None)
        lines.append(f"| {m} | {b} | " + " | ".join(vals) + f" | {_f(floor)} |")
    return "\n".join(lines)
