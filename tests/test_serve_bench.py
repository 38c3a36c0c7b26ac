"""The serving benchmark's CPU smoke run (tiny model, reference mode): it starts a server, runs the clients and
writes serve-reference.json and serve-reference.md with every figure."""
import json

from onekernel.bench.serve import main


def test_serve_bench_smoke(tmp_path):
    assert main(["--model", "tiny", "--random-weights", "--modes", "reference", "--clients", "1,3",
                 "--requests-per-client", "2", "--prompt-len", "5", "--max-tokens", "6", "--max-batch", "2",
                 "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "serve-reference.json").read_text())
    assert {"date", "gpu", "commit", "model", "max_seq_len"} <= set(rec) and rec["max_seq_len"] == 256
    assert [(r["clients"], r["requests"], r["tokens"]) for r in rec["records"]] == [(1, 2, 12), (3, 6, 36)]
    for r in rec["records"]:
        assert r["ttft_p50_ms"] <= r["ttft_p99_ms"] and r["itl_p50_ms"] <= r["itl_p99_ms"] and r["tokens_per_s"] > 0
    assert rec["records"][0]["itl_over_step"] > 0
    assert "| reference | 3 |" in (tmp_path / "serve-reference.md").read_text()
