"""`onekernel graph` prints a summary that matches the graph it builds; GPU-only tools refuse cleanly."""
import torch

from onekernel.cli import main
from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.tiling import Tiling


def test_graph_summary_counts_tasks(capsys):
    assert main(["graph", "--model", "tiny", "--batch", "2", "--context", "64", "--workers", "7"]) == 0
    out = capsys.readouterr().out
    g, _, _ = decode_graph(get_config("tiny"), 2, 64, torch.bfloat16, tiling=Tiling(7, "fit"))
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split()[1:3] == [str(len(g.ops)), str(len(g.tasks))]
    for op in g.ops:
        assert op.kind.name in out
    assert "7 workers): valid" in out


def test_gpu_tools_without_gpu_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for cmd in (["profile", "--model", "tiny", "--random-weights"], ["bench", "--model", "tiny", "--random-weights"]):
        assert main(cmd) == 2
        assert "need a CUDA GPU" in capsys.readouterr().err
