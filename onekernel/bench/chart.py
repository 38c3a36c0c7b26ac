"""PNG chart of benchmark records: ms per step per mode (or study variant), grouped by batch size, with each
batch's bandwidth floor as a dashed line (log scale: the modes span three orders of magnitude)."""
from __future__ import annotations

from pathlib import Path


def bench_chart(records: list[dict], path: str | Path, key: str = "mode", title: str | None = None) -> Path:
    """Write the chart of the records that have ``ms_per_step`` (failed ones are left out) to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in records if r.get("ms_per_step") is not None]
    batches = sorted({r["batch"] for r in recs})
    labels = list(dict.fromkeys(r[key] for r in recs))
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + len(batches) * len(labels) * 0.55), 4.8), dpi=120)
    for j, lab in enumerate(labels):
        xs, ys = [], []
        for i, b in enumerate(batches):
            t = next((r["ms_per_step"] for r in recs if r["batch"] == b and r[key] == lab), None)
            if t is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(t)
        ax.bar(xs, ys, width * 0.92, label=lab, color=cmap(j % cmap.N))
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.3g}", (x, y), ha="center", va="bottom", fontsize=6, rotation=90,
                        xytext=(0, 2), textcoords="offset points")
    for i, b in enumerate(batches):
        fl = next((r["floor_ms"] for r in recs if r["batch"] == b and r.get("floor_ms")), None)
        if fl:
            ax.hlines(fl, i - 0.45, i + 0.45, colors="k", linestyles="dashed",
                      label="bandwidth floor" if i == 0 else None)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    if recs:
        from matplotlib.ticker import FuncFormatter
        ax.set_yscale("log")
        lo = min([r["ms_per_step"] for r in recs] + [r["floor_ms"] for r in recs if r.get("floor_ms")])
        ax.set_ylim(lo * 0.7, max(r["ms_per_step"] for r in recs) * 1.6)
        fmt = FuncFormatter(lambda y, _: f"{y:g}")
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(fmt)
        ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_ylabel("ms per decode step (median)")
    r0 = recs[0] if recs else (records[0] if records else {})
    ax.set_title(title or f"{r0.get('model', '')} context {r0.get('context', '')} {r0.get('gpu', '')} "
                 f"{r0.get('commit', '')}".strip(), fontsize=9)
    if labels:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
