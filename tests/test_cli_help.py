"""`generate --help`, `bench --help`, `warmup --help` (and every other command's) name each option's default:
an option whose default is a value (not None / off) says "default" in its own help lines."""
import argparse
import re

import pytest

from onekernel.cli import build_parser


def _subparsers():
    parser = build_parser()
    return next(a for a in parser._actions if a.choices and "serve" in a.choices).choices


def _blocks(text: str) -> dict[str, str]:
    """option -> its help lines, joined (from the first line starting with the option to the next option)."""
    blocks, name = {}, None
    for line in text[text.index("options:"):].splitlines()[1:]:
        m = re.match(r"  (--?[a-z][a-z-]*)", line)
        if m:
            name = m.group(1)
            blocks[name] = ""
        if name:
            blocks[name] += " " + " ".join(line.split())
    return blocks


@pytest.mark.parametrize("command", ["generate", "bench", "warmup", "serve", "graph"])
def test_help_names_every_default(command):
    p = _subparsers()[command]
    blocks = _blocks(p.format_help())
    for a in p._actions:
        if (not a.option_strings or a.default is None or a.default is False or a.default == []
                or argparse.SUPPRESS in (a.default, a.help)):
            continue
        block = blocks[a.option_strings[0]]
        assert "default" in block, (command, a.option_strings, block)
    if command == "generate":
        text = " ".join(p.format_help().split())
        for words in ("tokens to generate per prompt (default: 64)", "0 = greedy (default: 0.0)",
                      "random weights (default: 0)", "(default: 1)"):
            assert words in text, words
