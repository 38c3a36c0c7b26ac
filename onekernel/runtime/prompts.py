"""The one home of the prompt checks: prompts -> token ids, each checked against the vocabulary and the
context. ``generate`` calls it; the CLI calls it too between reading the model's config and tokenizer and loading
its weights (``models.load.open_model``), so a prompt too long for the context is reported before the weights
load."""
from __future__ import annotations

from onekernel.errors import InputError


def utf8_problem(text: str) -> str | None:
    """Why ``text`` is not valid Unicode (``is not valid UTF-8 text (character 1 is '\\udcff')``), e.g. the lone
    surrogates Python makes of invalid UTF-8 bytes on a command line or a JSON ``\\ud800``; None when it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid UTF-8 text (character {e.start} is {text[e.start]!r})"
    return None


def _check_utf8(i: int, prompt) -> None:
    """InputError when prompt ``i`` (a string or chat messages) holds text that is not valid Unicode;
    tokenizers fail on it."""
    for text in [prompt] if isinstance(prompt, str) else [m.get("content") for m in prompt]:
        problem = utf8_problem(text) if isinstance(text, str) else None
        if problem:
            raise InputError(f"prompt {i} {problem}; pass the prompt as UTF-8")


def context_limit(model_context: int, max_seq_len: int | None) -> int:
    """The context a sequence may fill: ``max_seq_len`` if given (it must be in 1..model_context, else
    InputError), else the model's."""
    if max_seq_len is None:
        return model_context
    if not 1 <= max_seq_len <= model_context:
        raise InputError(f"max_seq_len (--max-seq-len) must be between 1 and the model's context of "
                         f"{model_context}, got {max_seq_len}")
    return max_seq_len


def encode_prompts(tokenizer, prompts, *, chat: bool, max_new_tokens: int, model_context: int,
                   max_seq_len: int | None = None, vocab_size: int | None = None) -> list[list[int]]:
    """Token ids of each prompt, checked.

    Args:
        tokenizer: a ``models.tokenizer.Tokenizer``.
        prompts: a list of texts (``chat``: the chat template is applied), lists of chat messages (``chat``)
            or lists of token ids.
        max_new_tokens: tokens to generate per prompt (>= 1, checked by the caller).
        model_context: the model's context length (``cfg.max_seq_len``).
        max_seq_len: a smaller context limit (``--max-seq-len``), or None for the model's.
        vocab_size: the model's vocabulary size; None skips the id range check (ids from the tokenizer).
    Returns:
        one list of int token ids per prompt.
    Raises:
        InputError: max_seq_len outside 1..model_context, a prompt of the wrong kind, text that is not valid
            UTF-8, ids outside the vocabulary, an empty prompt, or prompt + max_new_tokens over the context.
    """
    ctx = context_limit(model_context, max_seq_len)
    ids = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or (chat and isinstance(p, (list, tuple)) and p and all(isinstance(m, dict) for m in p)):
            _check_utf8(i, p)
            p = tokenizer.chat(p) if chat else tokenizer.encode(p)
        try:
            if isinstance(p, (bytes, bytearray)) or any(isinstance(t, float) for t in p):
                raise TypeError("token ids are integers")
            p = [int(t) for t in p]
        except (TypeError, ValueError):
            raise InputError(f"prompt {i} must be a string or a list of token ids (a list of chat messages "
                             f"needs chat=True)") from None
        bad = [t for t in p if vocab_size is not None and not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"prompt {i} has token ids outside the model's vocabulary [0, {vocab_size}): "
                             f"{bad[:5]}; the tokenizer does not match the model")
        if not p:
            raise InputError(f"prompt {i} is empty; every prompt needs at least one token")
        if len(p) + max_new_tokens > ctx:
            raise InputError(f"prompt {i} has {len(p)} token{'s' * (len(p) != 1)}; with max_new_tokens="
                             f"{max_new_tokens} it needs {len(p) + max_new_tokens} positions, over the context of "
                             f"{ctx}; shorten the prompt or lower --max-new-tokens"
                             + (f", or raise --max-seq-len (up to {model_context})" if ctx < model_context
                                else ""))
        ids.append(p)
    return ids
