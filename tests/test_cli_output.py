"""The CLI's output streams: a closed or full stdout, a closed stderr, the progress display (stderr only, off
with --quiet), batch files, and per-subcommand help."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from onekernel import cli

ROOT = Path(__file__).resolve().parents[1]
GEN = [sys.executable, "-m", "onekernel.cli", "generate", "--model", "tiny", "--random-weights", "--prompt", "hi",
       "--max-new-tokens", "3"]


def _run(argv, redirect="", **kw):
    """Run ``argv`` through sh with the shell ``redirect`` (e.g. ``>&-``); stdout/stderr captured unless the
    redirect replaces them."""
    cmd = " ".join(f"'{a}'" for a in argv) + " " + redirect
    return subprocess.run(["sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_stdout_closed_or_full_is_one_line(extra):
    for redirect in (">&-", "> /dev/full"):
        r = _run(GEN + extra, redirect)
        assert r.returncode == 1, (redirect, r.stderr)
        lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("note: no GPU")]
        assert len(lines) == 1 and lines[0].startswith("onekernel: error:") and "Traceback" not in r.stderr, r.stderr
        assert "standard output" in lines[0], lines[0]


def test_stderr_closed_keeps_json_pure():
    r = _run(GEN + ["--json"], "2>&-")
    assert r.returncode == 0
    assert len(json.loads(r.stdout)["sequences"][0]["generated_ids"]) == 3  # the note did not land on stdout
    r = _run(GEN + ["--max-new-tokens", "0"], "2>&-")  # an error with nowhere to say it: exit code only
    assert r.returncode == 2 and r.stdout == ""


def test_empty_batch_file_names_it(tmp_path, capsys):
    f = tmp_path / "prompts.txt"
    f.write_text("\n  \n\n")
    assert cli.main(["generate", "--batch-file", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "prompts.txt" in err and "no prompt" in err and "or --batch-file" not in err, err


def test_batch_file_byte_order_mark_is_not_a_token(tmp_path, capsys):
    f = tmp_path / "prompts.txt"
    f.write_bytes("\ufeffhello\nworld\n".encode("utf-8"))
    assert cli.main(["generate", "--model", "tiny", "--random-weights", "--batch-file", str(f),
                     "--max-new-tokens", "1", "--json", "--quiet"]) == 0
    seqs = json.loads(capsys.readouterr().out)["sequences"]
    assert [s["prompt"] for s in seqs] == ["hello", "world"]
    assert seqs[0]["prompt_ids"] == list(b"hello")  # byte-level tokenizer: no EF BB BF in front


def test_batch_help_is_each_subcommands_own(capsys):
    helps = {}
    for name in ("graph", "profile", "bench"):
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        lines = capsys.readouterr().out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("  --batch BATCH"))
        end = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("  -"))
        helps[name] = " ".join(" ".join(lines[at:end]).split())
    assert "comma-separated" in helps["bench"]
    for name in ("graph", "profile"):
        assert "comma" not in helps[name] and "bench" not in helps[name] and "batch size" in helps[name], helps


def test_progress_on_stderr_per_sequence(monkeypatch, capsys):
    """A run longer than the delay (0 here) shows tokens so far per sequence on stderr; stdout stays pure
    JSON; --quiet turns it off."""
    from onekernel import cli_progress
    monkeypatch.setattr(cli_progress, "DELAY_S", 0.0)
    argv = ["generate", "--model", "tiny", "--random-weights", "--prompt", "hi", "--prompt", "a longer one",
            "--max-new-tokens", "4", "--json"]
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert len(json.loads(out.out)["sequences"]) == 2
    assert "[0] 4/4" in out.err and "[1] 4/4" in out.err, out.err
    assert cli.main(argv + ["--quiet"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and len(json.loads(out.out)["sequences"]) == 2


def test_progress_says_kernels_compile_when_the_first_step_is_slow():
    from io import StringIO

    from rich.console import Console

    from onekernel import cli_progress
    for terminal in (False, True):
        buf = StringIO()
        with cli_progress.GenerateProgress(["a", "b"], 4, compile_note=True, delay_s=0.0,
                                           console=Console(file=buf, force_terminal=terminal, width=100)) as p:
            p.token(0, False)
            p.token(1, False)  # the prefill tokens: the first decode step (the one that compiles) starts
            p.token(0, False)
            p.token(1, True)
        text = buf.getvalue()
        rows = ("2/4", "2/4 done") if terminal else ("[0] 2/4", "[1] 2/4 done")  # a terminal draws bars between
        assert "compiling the Triton kernels" in text and all(r in text for r in rows), text
    buf = StringIO()
    with cli_progress.GenerateProgress(["a"], 4, compile_note=False, delay_s=0.0,
                                       console=Console(file=buf, force_terminal=False)) as p:
        p.token(0, False)
        p.token(0, False)
    assert "compiling" not in buf.getvalue()


def test_prompt_too_long_is_found_before_the_weights_load(monkeypatch, capsys):
    """The context check runs on the tokenizer and config that ``open_model`` reads, before
    ``ModelFiles.load`` reads the weights: for a config name and for the default GGUF."""
    from onekernel import cli_progress
    from onekernel.models.load import ModelFiles
    monkeypatch.setattr(cli_progress, "DELAY_S", 600.0)  # the GGUF tokenizer takes seconds: no status line
    monkeypatch.setattr(ModelFiles, "load", lambda *a, **k: pytest.fail("the weights loaded"))
    for argv in (["--model", "tiny", "--random-weights", "--prompt", "x" * 300],
                 ["--prompt", "hello " * 9000]):
        assert cli.main(["generate", *argv, "--max-new-tokens", "4"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "over the context of" in err and "shorten the prompt" in err, err


def test_cli_seed_gives_each_sequence_the_same_stream(capsys):
    """`--temperature 1 --seed 7`: "The cat sat" gives the same text alone, beside another prompt, and twice."""
    def run(*prompts):
        argv = ["generate", "--model", "tiny", "--random-weights", "--temperature", "1", "--seed", "7",
                "--max-new-tokens", "8", "--json", "--quiet"]
        assert cli.main(argv + [a for p in prompts for a in ("--prompt", p)]) == 0
        return [s["generated_ids"] for s in json.loads(capsys.readouterr().out)["sequences"]]
    alone = run("The cat sat")[0]
    assert run("The cat sat", "Hello") == [alone, run("Hello")[0]]
    assert run("The cat sat", "The cat sat") == [alone, alone]


def test_streamed_text_ends_its_line_before_the_last_status_line():
    """Off a terminal, with stdout and stderr in one file (``2>&1``), the streamed text's newline comes before the
    progress display's last status line, which so starts a line of its own (it was glued to the text)."""
    code = ("import sys; from onekernel import cli, cli_progress; cli_progress.DELAY_S = 0.0; "
            "sys.exit(cli.main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, *GEN[3:]], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    assert out.returncode == 0, out.stdout
    status = [i for i, ln in enumerate(out.stdout.splitlines()) if "onekernel generate:" in ln]
    assert status, out.stdout
    for i in status:
        assert out.stdout.splitlines()[i].startswith("onekernel generate:"), out.stdout
