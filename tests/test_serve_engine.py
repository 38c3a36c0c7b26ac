"""The serving engine in-process (the GPU's pipelined loop, run on the CPU), batch buckets over a KV cache's
slots, and stop strings."""
import random
import threading

import pytest
import torch

from onekernel.errors import InputError
from onekernel.models.load import load_model
from onekernel.runtime.buckets import BucketRunners, bucket_for, bucket_sizes
from onekernel.runtime.generate import generate
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import prefill
from onekernel.runtime.sampling import SamplingParams
from onekernel.serve.engine import Engine, GenRequest, QueueFullError
from onekernel.serve.text import StopText


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", random_weights=True, seed=3)


def test_bucket_sizes():
    assert bucket_sizes(16) == (1, 2, 4, 8, 16) and bucket_sizes(6) == (1, 2, 4, 6) and bucket_sizes(1) == (1,)
    assert [bucket_for(n, (1, 2, 4, 6)) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    for bad in (0, 17):
        with pytest.raises(InputError, match="max_batch"):
            bucket_sizes(bad)


def test_cache_slots_share_memory_and_prefill_one_slot(tiny, seed):
    cache = KVCache(tiny.config, 4, 16)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 256, (5,), generator=g).tolist()
    logits = prefill(tiny, cache.slots(2, 3), [prompt])
    alone = KVCache(tiny.config, 1, 16)
    assert torch.equal(logits, prefill(tiny, alone, [prompt]))
    assert cache.seq_lens.tolist() == [0, 0, 5, 0]
    assert torch.equal(cache.k[:, 2], alone.k[:, 0]) and not cache.k[:, [0, 1, 3]].any()
    with pytest.raises(InputError, match="outside"):
        cache.slots(3, 5)
    with pytest.raises(InputError, match="view"):
        cache.slots(0, 2).reallocate()


def test_bucket_runner_steps_only_its_slots(tiny, seed):
    br = BucketRunners("reference", tiny, 4, 16)
    br.cache.seq_lens[:] = torch.tensor([3, 1, 7, 2], dtype=torch.int32)
    before = br.cache.k.clone()
    br.runner(2).step(torch.tensor([5, 6], dtype=torch.int32))
    assert torch.equal(br.cache.k[:, 2:], before[:, 2:]) and not torch.equal(br.cache.k[:, :2], before[:, :2])
    with pytest.raises(InputError, match="bucket"):
        br.runner(3)


def test_stop_text_holds_back_a_possible_stop_string(tiny):
    s = StopText(tiny.tokenizer, ("cde", "xy"), set())
    pieces = [s.push(t) for t in b"abcdcdx"]
    assert [p for p, _ in pieces] == ["a", "b", "", "", "cd", "", "cd"] and not any(stop for _, stop in pieces)
    assert s.push(ord("y")) == ("", True) and s.text == "abcdcd"
    s = StopText(tiny.tokenizer, ("cde",), set())
    assert [s.push(t)[0] for t in b"abc"] == ["a", "b", ""] and s.flush() == "c"


def test_pipelined_engine_equals_generate_alone(tiny, seed):
    """The GPU's pipelined loop (pipeline=True) on the CPU: 12 requests on 4 slots, greedy and sampled, some
    one cancelled while queued, one moved to a lower slot; the rest equal generate alone."""
    rng = random.Random(seed)
    engine = Engine(tiny, "reference", 4, 64, max_queue=8, pipeline=True)  # 8 wait beyond the 4 free slots
    engine.warm()
    reqs = []
    for i in range(12):
        sampling = SamplingParams(0.8, 20, 0.9, seed + i) if i % 3 == 0 else SamplingParams()
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 9))]
        n = 50 if i == 3 else rng.randint(1, 12)  # slot 3 outlives the others: it moves down to slot 0
        reqs.append(GenRequest(prompt, n, sampling, top_logprobs=2 if i % 4 == 1 else None))
    outs, done = [[] for _ in reqs], threading.Semaphore(0)

    def sink(i):
        def put(item):
            outs[i].append(item)
            if item.finish_reason:
                done.release()
        return put
    handles = [engine.submit(r, sink(i)) for i, r in enumerate(reqs)]  # queued before the engine starts
    with pytest.raises(QueueFullError):
        engine.submit(reqs[0], sink(0))
    handles[11].cancel()
    engine.start()
    for _ in range(11):
        assert done.acquire(timeout=60), engine.error
    engine.stop()
    assert outs[11] == [] and engine.metrics.running._value.get() == 0 and engine.metrics.moves._value.get() > 0
    for r, out in zip(reqs[:11], outs):
        res = generate(tiny, [r.prompt_ids], max_new_tokens=r.max_tokens, sampling=r.sampling, max_seq_len=64)
        assert [o.token for o in out] == res.sequences[0].generated_ids
        assert "".join(o.text for o in out) == res.sequences[0].text
        if r.top_logprobs:
            assert all(len(o.top) == 2 and o.logprob <= o.top[0][1] + 1e-6 for o in out)


def test_serve_command_refuses_bad_options_in_one_line(capsys, tmp_path):
    """Each bad option gets its own one-line error before anything loads, even when the port is busy (a socket
    listens on it here): --max-seq-len 0 was ignored and 1 failed in the warm-up, after the model loaded."""
    import socket
    from onekernel.cli import main
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = ["--port", str(busy.getsockname()[1])]
        tiny = ["serve", "--model", "tiny", "--random-weights", *port]
        cases = [(["serve", "--max-batch", "0", *port], "--max-batch"),
                 ([*tiny, "--max-seq-len", "999"], "max_seq_len"),
                 ([*tiny, "--max-seq-len", "0"], "--max-seq-len must be >= 2"),
                 ([*tiny, "--max-seq-len", "1"], "--max-seq-len must be >= 2"),
                 (["serve", "--model", str(tmp_path / "none.gguf"), *port], "does not exist"),
                 ([*tiny], "cannot listen on 127.0.0.1:")]
        for args, words in cases:
            assert main(args) == 2, args
            err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("onekernel: error:")]
            assert len(err) == 1 and words in err[0], (args, err)


def test_window_text_pieces_add_up_to_the_whole_decode(seed):
    """Multi-byte characters split across tokens: the pieces (O(1) decode per token) equal the whole decode."""
    from onekernel.models.load import open_model
    from onekernel.serve.text import WindowText
    tok = open_model().tokenizer
    rng = random.Random(seed)
    words = ["Grüße", "世界", "🎉", "naïve", "café", "—", "ok", "\n", "Ωμέγα", "日本語"]
    ids = tok.encode(" ".join(rng.choice(words) for _ in range(40)))
    ids += [rng.randrange(tok.vocab_size) for _ in range(20)]  # arbitrary ids, partial UTF-8 included
    eos = next(iter(tok.eos_token_ids))
    w = WindowText(tok, {eos})
    pieces = [w.push(t) for t in ids[:30] + [eos] + ids[30:]]
    assert "".join(pieces) + w.finish() == tok.decode(ids)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_cpu_reference_step_attends_over_live_keys_with_the_same_bits(name, twin_caches, seed, monkeypatch):
    """A server's cache is 16 slots x 4096 positions; the CPU reference step attended over all of them (and copied
    them for GQA) at every step. It now attends over the live keys rounded up to KEY_BLOCK: the same logits and
    cache bits as the whole-cache step, whatever the other rows' lengths (batch invariance)."""
    import torch.nn.functional as F
    from onekernel.models.config import rope_inv_freq
    from onekernel.runtime.reference import KEY_BLOCK, ReferenceRunner, decode_one_token
    model = load_model(name, random_weights=True, seed=seed)
    rng = random.Random(seed)
    lens = [rng.randrange(2 * KEY_BLOCK) for _ in range(3)]
    (mine, full), g = twin_caches(model, 3, 4 * KEY_BLOCK, lens, seed)
    seen, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: seen.append(k.shape[-2]) or
                        sdpa(q, k, v, **kw))
    runner, inv_freq = ReferenceRunner(model, mine), rope_inv_freq(model.config)
    for _ in range(3):
        tokens = torch.randint(0, 256, (3,), generator=g, dtype=torch.int32)
        logits = runner.step(tokens)[0]
        assert set(seen) == {-(-(max(lens) + 1) // KEY_BLOCK) * KEY_BLOCK}, (seen, lens)
        want = decode_one_token(model.config, model.weights, full.k, full.v, full.seq_lens, tokens, inv_freq)
        assert torch.equal(logits, want) and torch.equal(mine.k, full.k) and torch.equal(mine.v, full.v)
        lens = [n + 1 for n in lens]
        for c in (mine, full):
            c.seq_lens += 1
        seen.clear()


@pytest.mark.parametrize("T,S", [(1, 700), (9, 9)])  # a decode step's query over a cache; a prefill's
def test_cpu_attention_gqa_without_the_copy_has_the_same_bits(T, S, seed):
    """On the CPU the reference attends with SDPA's enable_gqa instead of repeat_interleave-ing the cache: the
    same bits (SmolLM2's 9 query heads over 3 KV heads)."""
    import torch.nn.functional as F
    from onekernel.models.config import get_config
    from onekernel.runtime.reference import _attend
    cfg = get_config("smollm2-135m")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, cfg.n_heads, T, cfg.head_dim, generator=g)
    k, v = (torch.randn(3, cfg.n_kv_heads, S, cfg.head_dim, generator=g) for _ in range(2))
    mask = torch.rand(3, 1, T, S, generator=g) < 0.7
    mask[..., 0] = True
    rep = cfg.n_heads // cfg.n_kv_heads
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                          attn_mask=mask, scale=cfg.head_dim ** -0.5)
    assert torch.equal(_attend(cfg, q, k, v, mask), want.transpose(1, 2).reshape(3, T, -1))
