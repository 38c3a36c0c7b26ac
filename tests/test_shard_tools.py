"""The command lines of scripts/shard_bench.py and scripts/stream_profile.py --shard (one TP rank's shard run as a
model of its own on one GPU): a bad model, TP size, rank or batch gets one line and exit code 2 on any machine,
before anything touches a GPU; shard_bench on a machine without one says so."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import shard_bench  # noqa: E402
import stream_profile  # noqa: E402


@pytest.mark.parametrize("args,words", [
    (["--model", "llama-3.1-70b", "--tp", "3"], ["3", "heads"]),        # 64 heads: TP 3 does not divide them
    (["--model", "no-such-model", "--tp", "2"], ["no-such-model"]),
    (["--model", "llama-3.1-8b", "--tp", "2", "--rank", "2"], ["rank", "[0, 2)"]),
    (["--model", "llama-3.1-8b", "--tp", "2", "--batch", "1,x"], ["--batch", "1,x"]),
    (["--model", "llama-3.1-8b", "--tp", "2", "--batch", "0"], ["--batch"]),
])
def test_shard_bench_refuses_bad_input(args, words, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert shard_bench.main(args + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shard_bench: ") and "\n" not in err and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
def test_shard_bench_without_a_gpu(tmp_path, capsys):
    assert shard_bench.main(["--model", "llama-3.1-8b", "--tp", "2", "--out", str(tmp_path / "r.json")]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("shard,words", [("8", ["TP,RANK"]), ("8,x", ["TP,RANK"]), ("3,0", ["heads"]),
                                         ("2,5", ["rank"])])
def test_stream_profile_shard_refuses_bad_input(shard, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        stream_profile.main(["--out", str(tmp_path), "--model", "llama-3.1-8b", "--shard", shard])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert "Traceback" not in err and not any(tmp_path.iterdir())
