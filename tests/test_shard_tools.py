"""The command lines of scripts/shard_bench.py and scripts/stream_profile.py --shard (one TP rank's shard run as a
model of its own on one GPU): a bad model, TP size, rank, batch, context, step count or --out folder gets one line and
exit code 2 on any machine,
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
    (["--model", "llama-3.1-8b", "--tp", "2", "--batch", "\u00b2"], ["--batch"]),   # isdigit() but no int
    (["--model", "llama-3.1-8b", "--tp", "2", "--context", "0"], ["--context"]),
    (["--model", "llama-3.1-8b", "--tp", "2", "--steps", "0"], ["--steps"]),
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


def test_shard_bench_out_must_be_a_file_in_a_folder(tmp_path, capsys):
    for out in (tmp_path / "no" / "r.json", tmp_path):
        assert shard_bench.main(["--model", "llama-3.1-8b", "--tp", "2", "--out", str(out)]) == 2
        assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("args,words,one_line", [
    (["--shard", "8"], ["TP,RANK"], False), (["--shard", "8,x"], ["TP,RANK"], False),   # argparse's usage + error
    (["--shard", "\u00b2,0"], ["TP,RANK"], False),
    (["--shard", "3,0"], ["heads"], True), (["--shard", "2,5"], ["rank"], True),
    (["--shard", "2,0", "--batch", "0"], ["--batch"], True), (["--model", "nope", "--shard", "2,0"], ["nope"], True),
    (["--shard", "2,0", "--workers", "0"], ["--workers"], True)])
def test_stream_profile_shard_refuses_bad_input(args, words, one_line, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        stream_profile.main(["--out", str(tmp_path), "--model", "llama-3.1-8b"] + args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert "Traceback" not in err and not any(tmp_path.iterdir())
    if one_line:
        assert err.startswith("stream_profile: ") and err.count("\n") == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
def test_stream_profile_without_a_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        stream_profile.main(["--out", str(tmp_path), "--model", "llama-3.1-8b", "--shard", "2,0"])
    assert e.value.code == 2 and "CUDA GPU" in capsys.readouterr().err
