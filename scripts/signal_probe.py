"""How long does one stage hand its activation to the next? A ping-pong between two CTAs on an H200, for the
streaming megakernel's design question (docs/DESIGN.md, "What remains at batch 1"):

    python scripts/signal_probe.py [--iters 2000] [--words 512] [--out probe.json]

Two programs (CTAs) pass a message of ``--words`` words back and forth, each word 4 bytes of payload in an 8-byte
slot (512 words: 2 KB of payload in 4 KB of lines; 1024 would be a Llama-3.2-1B activation row); the other programs of the grid either idle or stream HBM (a copy of 4 GB, the weight stream's load). One
hop = one message from writer to reader, read and checked; the table gives the median hop in ns over ``--iters``
hops (the HBM stream repeats its copy 8 times, ~16 ms, longer than the hops), two ways:

* ``counter`` (what the megakernel does): the writer stores the payload, CTA barrier, one thread's
  ``red.release.gpu`` on a counter; the reader spins with ``ld.acquire.gpu`` on the counter, then loads the payload
  (``.cg``).
* ``ll`` (NCCL's LL protocol): each 8-byte word carries 4 bytes of payload and a 4-byte flag (the hop number), written
  with one ``st.relaxed.gpu.v2``, no fence; the reader re-reads its words (``ld.relaxed.gpu.v2``) until every flag is
  the hop's, then a CTA barrier.

Every hop's payload is checked (word j of hop i holds i * 65536 + j); a mismatch counts as an error. Needs a CUDA
GPU; it writes one JSON record per (protocol, background) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from onekernel.exec.mk_device import ld_acquire as _ld_acquire  # noqa: E402  (the Triton megakernel's own poll)


@triton.jit
def _ld2(p):
    return tl.inline_asm_elementwise("ld.global.relaxed.gpu.v2.b32 {$0, $1}, [$2];", "=r,=r,l", [p],
                                     dtype=(tl.int32, tl.int32), is_pure=False, pack=1)


@triton.jit
def _st2(p, a, b):
    return tl.inline_asm_elementwise("st.global.relaxed.gpu.v2.b32 [$1], {$2, $3}; mov.b32 $0, 0;", "=r,l,r,r",
                                     [p, a, b], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _probe(msg, cnt, times, errs, src, dst, n_copy, ITERS: tl.constexpr, WORDS: tl.constexpr, LL: tl.constexpr,
           STREAM: tl.constexpr, CHUNK: tl.constexpr, REPS: tl.constexpr):
    pid = tl.program_id(0)
    j = tl.arange(0, WORDS)
    if pid < 2:
        bad = tl.zeros([WORDS], tl.int32)
        for i in range(ITERS):
            if i % 2 == pid:  # write hop i into the other's mailbox
                box = msg + (1 - pid) * WORDS * 2
                val = i * 65536 + j
                if LL:
                    _st2(box + 2 * j, val, tl.zeros([WORDS], tl.int32) + i + 1)
                else:
                    tl.store(box + 2 * j, val)
                    tl.debug_barrier()
                    tl.atomic_add(cnt + (1 - pid), 1, sem="release", scope="gpu")
            else:  # read hop i from my mailbox
                box = msg + pid * WORDS * 2
                if LL:
                    v, f = _ld2(box + 2 * j)
                    while tl.max(tl.where(f != i + 1, 1, 0), axis=0) != 0:
                        v, f = _ld2(box + 2 * j)
                    tl.debug_barrier()
                else:
                    want = i // 2 + 1  # hops written to me so far, this one included
                    seen = _ld_acquire(cnt + pid)
                    while seen < want:
                        seen = _ld_acquire(cnt + pid)
                    v = tl.load(box + 2 * j, cache_modifier=".cg")
                bad += tl.where(v != i * 65536 + j, 1, 0)
                tl.store(times + pid * ITERS + i, globaltimer())
        tl.store(errs + pid, tl.sum(bad, axis=0))
    elif STREAM:  # the other SMs stream HBM the whole time, as the weight stream does
        offs = tl.arange(0, CHUNK)
        nprog = tl.num_programs(0) - 2
        for r in range(REPS):
            for c in range(pid - 2, n_copy // CHUNK, nprog):
                tl.store(dst + c * CHUNK + offs, tl.load(src + c * CHUNK + offs,
                                                         eviction_policy="evict_first"))


def run(ll: bool, stream: bool, iters: int, words: int, grid: int) -> dict:
    dev = torch.device("cuda")
    msg = torch.zeros(2 * words * 2, dtype=torch.int32, device=dev)
    cnt = torch.zeros(2, dtype=torch.int32, device=dev)
    times = torch.zeros(2 * iters, dtype=torch.int64, device=dev)
    errs = torch.zeros(2, dtype=torch.int32, device=dev)
    n_copy = (1 << 30) if stream else 4096  # int32 elements: 4 GB read
    src = torch.ones(n_copy, dtype=torch.int32, device=dev)
    dst = torch.empty_like(src)
    k = _probe[(grid if stream else 2,)](msg, cnt, times, errs, src, dst, n_copy, ITERS=iters, WORDS=words, LL=ll,
                                         STREAM=stream, CHUNK=4096, REPS=8, num_warps=4)
    torch.cuda.synchronize()
    t = times.view(2, iters).cpu()
    # hop i is read by program (i + 1) % 2 at times[(i + 1) % 2, i]; a hop = read time of hop i - read time of hop i-1
    read = torch.tensor([int(t[(i + 1) % 2, i]) for i in range(iters)], dtype=torch.int64)
    hops = (read[1:] - read[:-1]).float()
    skip = min(100, iters // 10)  # warm-up hops
    hops = hops[skip:]
    return {"protocol": "ll" if ll else "counter", "background": "hbm stream" if stream else "idle",
            "words": words, "payload_bytes": words * 4, "hops": int(hops.numel()),
            "median_ns": float(hops.median()), "p10_ns": float(hops.quantile(0.1)),
            "p90_ns": float(hops.quantile(0.9)), "errors": int(errs.sum()), "regs": getattr(k, "n_regs", None),
            "gpu": torch.cuda.get_device_name(dev)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--words", type=int, default=512)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("signal_probe.py needs a CUDA GPU")
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    recs = []
    for stream in (False, True):
        for ll in (False, True):
            t0 = time.perf_counter()
            rec = run(ll, stream, a.iters, a.words, grid)
            rec["s"] = round(time.perf_counter() - t0, 2)
            recs.append(rec)
            print(json.dumps(rec), flush=True)
    print("\n| protocol | background | median hop (ns) | p10 | p90 | errors |\n|---|---|---|---|---|---|")
    for r in recs:
        print(f"| {r['protocol']} | {r['background']} | {r['median_ns']:.0f} | {r['p10_ns']:.0f} | {r['p90_ns']:.0f} | "
              f"{r['errors']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
