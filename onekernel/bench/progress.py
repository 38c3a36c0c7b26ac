"""A progress display over the benchmark's cases (``rich``, on stderr): a bar with the case now running, and
one line per finished case."""
from __future__ import annotations

from contextlib import contextmanager


def _line(r: dict) -> str:
    name = r.get("variant", r["mode"])
    if r.get("error"):
        return f"  b={r['batch']} {name}: [red]{r['error'][:160]}[/red]"
    if r.get("profiled"):
        return f"  b={r['batch']} {name}: launch gaps {r['launch_gaps_us']:.1f} us over {r['boundaries']} boundaries"
    return f"  b={r['batch']} {name}: {r['ms_per_step']:.3f} ms ({r['pct_of_floor']:.1f}% of floor)"


@contextmanager
def progress(total: int, title: str):
    """Yields (started(label), done(record)) callbacks; ``done`` advances the bar by one case."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as p:
        task = p.add_task(title, total=total)

        def started(label: str) -> None:
            p.update(task, description=f"{title}: {escape(label)}")

        def done(rec: dict) -> None:
            p.console.print(_line({**rec, "error": escape(rec["error"]) if rec.get("error") else None}))
            p.advance(task)

        yield started, done
