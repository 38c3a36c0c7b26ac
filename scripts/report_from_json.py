"""Write the markdown table (or study report) and the PNG chart of an ``onekernel bench`` JSON file, the
same way the CLI does at the end of a run; for a run stopped by a time limit, whose JSON (written after every
record) is complete up to the stop but which never reached the end.

    python scripts/report_from_json.py benchmarks/results/DIR/bench-....json [more.json ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from onekernel.bench.chart import bench_chart  # noqa: E402
from onekernel.bench.report import bench_table, fill_ratios, study_report  # noqa: E402


def main(paths: list[str]) -> None:
    for p in map(Path, paths):
        records = json.loads(p.read_text())
        study = any("variant" in r for r in records)
        timed = [r for r in fill_ratios(records) if not r.get("profiled")]
        bench_chart(timed, p.with_suffix(".png"), key="variant" if study else "mode")
        table = bench_table([{**r, "mode": r.get("variant", r["mode"])} for r in timed])
        p.with_suffix(".md").write_text((study_report(records) if study else table) + "\n")
        print(f"wrote {p.with_suffix('.md')} and .png ({len(records)} records)")


if __name__ == "__main__":
    main(sys.argv[1:])
