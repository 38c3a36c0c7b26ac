"""The command line around `onekernel serve`: one --dtype spelling for every command (the shared
`models.load.DTYPE_CHOICES` / `dtype_option`), and `serve --help` naming the defaults."""
import re
from pathlib import Path

import pytest
import torch

from onekernel.cli import build_parser
from onekernel.errors import InputError
from onekernel.models.load import DTYPE_CHOICES, dtype_option


def _subparsers():
    parser = build_parser()
    return next(a for a in parser._actions if a.choices and "serve" in a.choices).choices


def test_every_command_with_dtype_takes_the_same_spellings():
    with_dtype = {name: p for name, p in _subparsers().items()
                  if any("--dtype" in a.option_strings for a in p._actions)}
    assert {"generate", "serve", "warmup"} <= set(with_dtype)
    for name, p in with_dtype.items():
        action = next(a for a in p._actions if "--dtype" in a.option_strings)
        assert tuple(action.choices) == DTYPE_CHOICES and action.default == "auto", name
        for spelling in DTYPE_CHOICES + ("BF16", "Float32"):
            assert action.type(spelling) in action.choices, (name, spelling)
    assert [dtype_option(s, "cpu") for s in ("bf16", "BFloat16", "fp16", "float32", "auto")] == [
        torch.bfloat16, torch.bfloat16, torch.float16, torch.float32, torch.float32]
    assert dtype_option("auto", "cuda") == torch.bfloat16
    with pytest.raises(InputError, match="--dtype 'float64'.*auto, bfloat16"):
        dtype_option("float64", "cpu")


def test_serve_help_names_every_default():
    text = " ".join(_subparsers()["serve"].format_help().split())
    for words in ("default: megakernel on a GPU; on the CPU reference, or eager with --interpret",
                  "(default: 8000)", "1..16 (default: 16)", "at most 4096)", "(default: auto = bfloat16 on cuda, "
                  "float32 on the cpu", "(default: 256)", "(default: 127.0.0.1)"):
        assert words in text, words


def test_readme_serve_section_names_the_real_flags_and_defaults():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("## Serve\n"):readme.index("Serving benchmark:")]  # its flags are not serve's
    serve = _subparsers()["serve"]
    flags = {o for a in serve._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    named = set(re.findall(r"--[a-z][a-z-]+", section))
    assert flags <= named and named <= flags, (flags - named, named - flags)
    defaults = {a.dest: a.default for a in serve._actions}
    rows = dict(re.findall(r"^\| `(--[a-z-]+)[^|]*\| (.+) \|$", section, re.M))
    assert f"{defaults['max_batch']} (1..16)" == rows["--max-batch"] and str(defaults["max_queue"]) == rows["--max-queue"]
    assert f"`{defaults['host']}`, `{defaults['port']}`" == rows["--host"] and "at most 4096" in rows["--max-seq-len"]
    assert rows["--mode"].startswith("`megakernel` on a GPU; on the CPU `reference`, or `eager` with `--interpret`")


def test_port_zero_names_the_port_the_system_picked():
    """--port 0: the server listens on the free port the operating system picks and names that one (the ready
    line used to say :0)."""
    import socket

    from onekernel.serve.main import check_address

    port = check_address("127.0.0.1", 0)
    assert 0 < port <= 65535
    with socket.socket() as s:  # it is free: the server can bind it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    assert check_address("127.0.0.1", port) == port


def test_a_port_out_of_range_is_refused_before_the_model_is_read(monkeypatch, capsys):
    """`serve --port 99999` fails in the option checks (exit 2, one line), not after reading the model: the
    model loader is replaced by one that fails the test if it is called."""
    import onekernel.serve.main as serve_main
    from onekernel.cli import main

    def no_model(*a, **k):
        raise AssertionError("the model was opened before the port was checked")
    monkeypatch.setattr(serve_main, "open_model", no_model, raising=False)
    monkeypatch.setattr("onekernel.models.load.open_model", no_model)
    for port in ("99999", "-1"):
        assert main(["serve", "--port", port]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--port {port} is outside 0..65535" in err[0], err


def test_version_names_the_installed_package(capsys):
    from importlib.metadata import version

    from onekernel.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"onekernel {version('onekernel')}"
