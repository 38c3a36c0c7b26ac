"""Can a warp-specialised Gluon persistent kernel stream weights at near copy bandwidth across task
boundaries and dependency waits? (Problem: common.py; background: shared/research/streaming.md.)

    python scripts/stream_proto/gluon_stream.py --preset llama-1b --variant deps|nodeps --workers 132 --out F
    python scripts/stream_proto/gluon_stream.py --tiny-check --preset llama-1b ...  # tiny, 2 workers, first
    python scripts/stream_proto/gluon_stream.py --preset llama-8b --compile-only     # no GPU: sm_90a report

Design. One CTA per worker (grid = W). Weights are re-packed on the host into one contiguous stream per
worker: for each stage in order, for each 8-row group of the worker's tile, for each 1024-column block, one
16 KB chunk = W_s[8 rows, 1024 cols] row-major (K zero-padded to a multiple of 1024; only `tiny` pads).
The stream is viewed as a [chunks*32, 256] bf16 tensor so one TMA box [32, 256] (unswizzled) = one chunk.
* Loader partition (1 warp): walks the worker's whole chunk sequence with one TMA copy per chunk into a
  ring of SLOTS x 16 KB shared-memory slots (mbarriers `ready`/`empty` per slot). It never looks at the
  dependency counters: weights don't depend on activations, so the ring stays full across task boundaries
  and while the consumer waits.
* Consumer partition (4 warps, the default partition), per stage s:
    spin (ld.acquire.gpu, every thread) until counter[s-1] >= W * epoch      [skipped by --variant nodeps]
    x_s -> registers with .cg loads (after the acquire, so never stale), -> shared xbuf, partition barrier
    per 8-row group: per chunk: wait ready[slot], chunk -> registers, arrive empty[slot] (the slot is
        refilled while we compute), acc[8, 1024] += w * x_chunk (fp32); one row reduction per group; store
    partition barrier; one release atomic add (gpu scope) on counter[s]
  The epoch is read once at entry; the last worker to finish bumps it (counters are never reset).
Every wait is bounded (no hang): the dependency spin and the consumer's mbarrier waits give up after WAIT_NS, the
loader's after 2 * WAIT_NS; the GPU's first failure is recorded in err (code, worker, and what it waited for:
ERRORS), the host prints it. After an mbarrier timeout a partition skips its later waits, arrives and copies,
so it runs to the end at once; a consumer that consumed another number of chunks than its loader streamed
records that too.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from onekernel.exec.stream_base import record as _record, smem_addr as _smem_addr, spin as _spin, wait_bounded as _wait  # noqa: E402,E501
from common import (ROW_GROUP, check_stages, copy_bandwidth_gbs, make_weights, parse_args,  # noqa: E402
                    stages_for, tile_groups, time_launches, write_record)

CK = 1024                         # chunk columns; a chunk is [ROW_GROUP, CK] bf16 = 16 KB
BOX = [ROW_GROUP * CK // 256, 256]  # the chunk as one TMA box (box dims are limited to 256)
SMEM_LIMIT = 232448               # H100/H200 max dynamic shared memory per CTA (227 KB)
WAIT_NS = 2_000_000_000           # a wait gives up after this long (the loader's after twice this)
W_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)  # plain row-major
ERRORS = {1: ("dependency spin", "stage", "seen", "want"),  # err[0] code: (what failed, names of err[2:5])
          2: ("consumer wait ready", "chunk", "slot", "phase"), 3: ("loader wait empty", "chunk", "slot", "phase"),
          4: ("consumer chunk count", "consumed", "streamed", "-")}


@gluon.jit
def _loader(w_desc, ring, bars, err, wid, c0, n_chunks, SLOTS: gl.constexpr, BARS: gl.constexpr,
            WAIT_NS: gl.constexpr):
    """1 warp: TMA chunk c0 + i of the packed stream into slot i % SLOTS, for i in [0, n_chunks). Its waits get
    twice the consumer's bound (a full ring legitimately waits as long as the consumer's longest wait), so the
    first recorded failure is the cause."""
    rows: gl.constexpr = w_desc.block_type.shape[0]
    empty0 = _smem_addr(BARS + 8 * SLOTS)  # bars[SLOTS + slot]: slot free again
    ok = 1
    for i in range(n_chunks):
        slot = i % SLOTS
        ok = _wait(ok, empty0 + 8 * slot, ((i // SLOTS) & 1) ^ 1, err, 3, wid, i, slot, 2 * WAIT_NS)  # fresh: parity 1
        mbarrier.expect(bars.index(slot), w_desc.block_type.nbytes, pred=ok != 0)
        tma.async_copy_global_to_shared(w_desc, [(c0 + i) * rows, 0], bars.index(slot), ring.index(slot), pred=ok != 0)


@gluon.jit
def _consumer(ring, bars, xbuf, acts, wtab, stab, counters, err, wid, n_workers, n_stages, epoch, n_chunks,
              SLOTS: gl.constexpr, XR: gl.constexpr, DEPS: gl.constexpr, BARS: gl.constexpr,
              WAIT_NS: gl.constexpr):
    """4 warps: for every stage, wait, read x once into xbuf, multiply the tile's chunks from the ring, signal.

    wtab int32 [W, S, 2]: (first row group, row groups) of worker w's tile of stage s (a group = 8 rows).
    stab int32 [S, 4]: (K / 1024 rounded up, x offset / 8, out offset / 8, K / 8); offsets in ``acts`` (bf16).
    Offsets and K are stored in 8-element (16-byte) units so the compiler knows the x loads are 16-byte
    aligned and their mask constant over 8 elements (one 16-byte load per 8 elements).
    The stage's record is loaded in its own iteration: Triton 3.6 (gluon-canonicalize's dead-iter-arg elimination)
    drops a loop-carried value that is only used as an inner loop's bound, so a record prefetched into the next
    iteration left every stage with stage 0's row-group and K-block counts (and the ring protocol deadlocked)."""
    BL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])   # chunk [8, 1024]: warp = 2 rows
    #   (num_warps = 4: a thread holds 2 rows x 4 x 8 columns; each warp reads 512 contiguous bytes per row)
    XL: gl.constexpr = gl.SliceLayout(0, BL)                               # x chunk [1024]
    RL: gl.constexpr = gl.SliceLayout(1, BL)                               # row sums [8]
    CHUNK_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])      # the slot seen as [8, 1024]
    xr = gl.arange(0, XR, layout=gl.SliceLayout(1, BL))
    xc = gl.arange(0, 1024, layout=XL)
    xoffs = xr[:, None] * 1024 + xc[None, :]
    rows8 = gl.arange(0, 8, layout=RL)
    xrows = xbuf._reinterpret(gl.bfloat16, [XR, 1024], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # .index(kb): [1024]
    ready0 = _smem_addr(BARS)  # bars[slot]: slot filled
    t = wtab + wid * n_stages * 2
    ok = 1
    i = 0  # chunks consumed: ring slot i % SLOTS, pass i // SLOTS
    for s in range(n_stages):
        g0, ngroups = gl.load(t + 2 * s), gl.load(t + 2 * s + 1)
        r = stab + 4 * s
        nkb, xo, oo, k8 = gl.load(r), gl.load(r + 1), gl.load(r + 2), gl.load(r + 3)
        if DEPS:
            if s > 0:
                _spin(counters + s - 1, n_workers * epoch, err, wid, s, WAIT_NS)
        x = gl.load(acts + xo * 8 + xoffs, mask=xoffs < k8 * 8, other=0.0, cache_modifier=".cg")
        xbuf.store(x)
        gl.thread_barrier()
        out = acts + oo * 8 + g0 * 8
        for g in range(ngroups):
            acc = gl.zeros([8, 1024], gl.float32, BL)
            for kb in range(nkb):
                xk = xrows.index(kb).load(XL)
                slot = i % SLOTS
                ok = _wait(ok, ready0 + 8 * slot, (i // SLOTS) & 1, err, 2, wid, i, slot, WAIT_NS)
                w = ring.index(slot)._reinterpret(gl.bfloat16, [8, 1024], CHUNK_SL).load(BL)
                gl.thread_barrier()  # every warp has its part of the slot in registers
                fence_async_shared()  # order the generic-proxy reads before the next TMA write
                mbarrier.arrive(bars.index(SLOTS + slot), pred=ok != 0)
                acc += w.to(gl.float32) * xk.to(gl.float32)[None, :]
                i += 1
            gl.store(out + g * 8 + rows8, gl.sum(acc, axis=1).to(gl.bfloat16))
        gl.thread_barrier()  # all stores of the tile issued, xbuf free for the next stage
        gl.atomic_add(counters + s, 1, sem="release", scope="gpu")
    if i != n_chunks:
        _record(err, 4, wid, i, n_chunks, 0)


@gluon.jit
def stream_kernel(w_desc, acts, wtab, stab, chunk_off, counters, epoch_ptr, done_ptr, err, n_stages,
                  SLOTS: gl.constexpr, XR: gl.constexpr, DEPS: gl.constexpr, BARS: gl.constexpr,
                  WAIT_NS: gl.constexpr):
    """Grid (W,). w_desc: TMA descriptor of the packed stream [chunks*32, 256] bf16, box [32, 256];
    chunk_off int32 [W+1]: worker w streams chunks [chunk_off[w], chunk_off[w+1]). counters int32 [S]
    (monotonic), epoch_ptr / done_ptr int32 [1], err int32 [8] (see _record, ERRORS); see _consumer for acts,
    wtab, stab. mbarriers: bars[slot] = ready (slot filled), bars[SLOTS + slot] = empty (slot free), at byte
    BARS of shared memory."""
    wid = gl.program_id(0)
    n_workers = gl.num_programs(0)
    epoch = gl.load(epoch_ptr, volatile=True)
    ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS] + w_desc.block_type.shape, w_desc.layout)
    xbuf = gl.allocate_shared_memory(gl.bfloat16, [XR, 1024], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    bars = gl.allocate_shared_memory(gl.int64, [2 * SLOTS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2 * SLOTS):
        mbarrier.init(bars.index(j), count=1)
    c0 = gl.load(chunk_off + wid)
    n_chunks = gl.load(chunk_off + wid + 1) - c0
    gl.warp_specialize([
        (_consumer, (ring, bars, xbuf, acts, wtab, stab, counters, err, wid, n_workers, n_stages, epoch, n_chunks,
                     SLOTS, XR, DEPS, BARS, WAIT_NS)),
        (_loader, (w_desc, ring, bars, err, wid, c0, n_chunks, SLOTS, BARS, WAIT_NS)),
    ], [1], [24])
    done = gl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if done == n_workers * epoch - 1:
        gl.atomic_add(epoch_ptr, 1, sem="release", scope="gpu")


def bar_offset(slots: int, xr: int) -> int:
    """Where Triton 3.6 allocates the mbarriers: after the ring and xbuf (check_barrier_offsets verifies it)."""
    return slots * ROW_GROUP * CK * 2 + xr * CK * 2


def check_barrier_offsets(llir: str, bars: int, slots: int) -> None:
    """The waits address mbarrier j as global_smem + bars + 8 * j: check the offsets the kernel initialises."""
    offs = [int(o or 0) for o in re.findall(r"mbarrier\.init[^\n]*@global_smem(?:, i32 (\d+))?\)", llir)]
    assert sorted(offs) == [bars + 8 * j for j in range(2 * slots)], f"mbarriers not at byte {bars}: {offs}"


# ------------------------------------------------------------------------------------------------ host side
def plan(stages, W: int, device):
    """Tiles and kernel tables, as a dict: bounds (per stage, [W+1] in row groups), nkb (per stage), start
    ([S, W]: where worker w's stage-s chunks begin in the packed stream), wtab / stab / chunk_off (int32, on
    device; see the kernels), n_chunks, acts_len (input + every stage's output) and out_off (per stage)."""
    bounds = [tile_groups(st.N, W) for st in stages]
    nkb = [-(-st.K // CK) for st in stages]
    per = torch.stack([(b[1:] - b[:-1]) * k for b, k in zip(bounds, nkb)])       # [S, W] chunks
    chunk_off = torch.zeros(W + 1, dtype=torch.int64)
    chunk_off[1:] = per.sum(0).cumsum(0)
    start = chunk_off[:-1][None, :] + per.cumsum(0) - per                        # [S, W]
    out_off, o = [], stages[0].K
    for st in stages:
        out_off.append(o)
        o += st.N
    for i, st in enumerate(stages):
        n_prev = stages[i - 1].N if i else stages[0].K
        assert st.K <= n_prev, "x_s = out_{s-1}[:K] needs K_s <= N_{s-1} (true for every preset)"
    xo = [0] + out_off[:-1]
    assert all(v % 8 == 0 for v in out_off + xo + [st.N for st in stages] + [st.K for st in stages])
    wtab = torch.stack([torch.stack([b[:-1] for b in bounds], 1), torch.stack([b[1:] - b[:-1] for b in bounds], 1)],
                       2)                                                         # [W, S, 2]
    stab = torch.tensor([[k, a // 8, b // 8, st.K // 8] for k, a, b, st in zip(nkb, xo, out_off, stages)])
    assert chunk_off[-1] * BOX[0] < 2 ** 31, "TMA row coordinate overflows int32"
    i32 = dict(dtype=torch.int32, device=device)
    return dict(bounds=bounds, nkb=nkb, start=start, wtab=wtab.to(**i32).contiguous(), stab=stab.to(**i32),
                chunk_off=chunk_off.to(**i32), n_chunks=int(chunk_off[-1]), acts_len=o, out_off=out_off)


def pack(ws, p, device) -> torch.Tensor:
    """The per-worker streams, back to back: bf16 [chunks, 8, 1024] (see the module docstring)."""
    packed = torch.empty(p["n_chunks"], ROW_GROUP, CK, dtype=torch.bfloat16, device=device)
    start = p["start"].to(device)
    for s, w in enumerate(ws):
        N, K = w.shape
        nkb, b = p["nkb"][s], p["bounds"][s].to(device)
        wp = torch.nn.functional.pad(w, (0, nkb * CK - K)) if nkb * CK != K else w
        chunks = wp.view(N // ROW_GROUP, ROW_GROUP, nkb, CK).transpose(1, 2).reshape(-1, ROW_GROUP, CK)
        grp = torch.arange(N // ROW_GROUP, device=device)
        owner = torch.searchsorted(b, grp, right=True) - 1                        # worker of each row group
        first = start[s, owner] + (grp - b[owner]) * nkb                           # its first chunk
        packed[(first[:, None] + torch.arange(nkb, device=device)[None, :]).reshape(-1)] = chunks
    return packed


def default_slots(xr: int) -> int:
    """Ring slots (<= 12) that fit next to an [xr, 1024] bf16 xbuf and the mbarriers."""
    return min(12, (SMEM_LIMIT - xr * CK * 2 - 1024) // (ROW_GROUP * CK * 2))


def compile_only(args) -> None:
    """Compile both variants for sm_90a (CPU tensors stand in for the GPU ones: only dtypes matter), check the
    mbarrier offsets and print ptxas registers / spills, the registers the SASS really touches, shared memory, the
    register split of the partitions (setmaxnreg) and the mbarrier waits (bounded ones: our try_wait sites;
    unbounded: Triton's mbarrier.wait). PTX_OUT=dir also writes the PTX there."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    stages = stages_for(args.preset, args.layers)
    xr = triton.next_power_of_2(max(-(-s.K // CK) for s in stages))
    slots = args.slots or default_slots(xr)
    i32 = torch.zeros(4, dtype=torch.int32)
    desc = TensorDescriptor(torch.zeros(BOX, dtype=torch.bfloat16), BOX, [256, 1], BOX, W_LAYOUT)
    for deps in (True, False):
        args_ = [desc, torch.zeros(8, dtype=torch.bfloat16)] + [i32] * 7 + [len(stages)]
        names = stream_kernel.arg_names
        sig = {n: mangle_type(a) for n, a in zip(names, args_)}
        const = dict(SLOTS=slots, XR=xr, DEPS=deps, BARS=bar_offset(slots, xr), WAIT_NS=WAIT_NS)
        sig.update({n: "constexpr" for n in const})
        consts = {(names.index(n),): v for n, v in const.items()}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(args_) if isinstance(a, torch.Tensor)}
        k = triton.compile(GluonASTSource(stream_kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4})
        check_barrier_offsets(k.asm["llir"], const["BARS"], slots)
        ptx, bindir = k.asm["ptx"], Path(triton.__file__).parent / "backends/nvidia/bin"
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "k.ptx").write_text(ptx)
            (Path(d) / "k.cubin").write_bytes(k.asm["cubin"])
            rep = subprocess.run([str(bindir / "ptxas"), "-v", "--gpu-name", "sm_90a", f"{d}/k.ptx", "-o", os.devnull],
                                 capture_output=True, text=True).stderr
            sass = subprocess.run([str(bindir / "nvdisasm"), "-c", f"{d}/k.cubin"], capture_output=True,
                                  text=True).stdout
        regs = re.search(r"Used (\d+) registers", rep)
        spill = re.search(r"(\d+) bytes spill stores", rep)
        maxnreg = sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
        top = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1) + 1
        print(f"{args.preset} {'deps' if deps else 'nodeps'}: slots {slots} xbuf {xr}x{CK}  "
              f"regs {regs.group(1) if regs else '?'} (launch; SASS uses R0-R{top - 1})  "
              f"spill {spill.group(1) if spill else 0} B  smem {k.metadata.shared} B  warps {k.metadata.num_warps}  "
              f"setmaxnreg {maxnreg}  TMA copy sites {len(re.findall(r'cp.async.bulk.tensor', ptx))}  "
              f"mbarrier waits: bounded {ptx.count('try_wait.parity.shared::cta.b64 p,')} "
              f"unbounded {ptx.count('try_wait.parity.shared.b64 complete')}")
        if os.environ.get("PTX_OUT"):
            Path(os.environ["PTX_OUT"]).mkdir(parents=True, exist_ok=True)
            (Path(os.environ["PTX_OUT"]) / f"{args.preset}_{int(deps)}.ptx").write_text(ptx)


def describe(err: list[int]) -> str:
    """The error record err[0:5] in words."""
    if err[0] == 0:
        return "none"
    name, *fields = ERRORS[err[0]]
    return f"{name} failed: worker {err[1]} " + " ".join(f"{f} {v}" for f, v in zip(fields, err[2:5]))


def first_run(name: str, stages, W: int, slots_arg, variants, dev):
    """Pack the problem for W workers, compile the variants (checking the mbarrier offsets), run once with the
    dependencies on and check every stage. Returns (launch(deps), p, slots, err, passed, stage errors)."""
    assert W <= torch.cuda.get_device_properties(dev).multi_processor_count, "workers must all be resident"
    S = len(stages)
    ws, x0 = make_weights(stages, dev)
    p = plan(stages, W, dev)
    packed = pack(ws, p, dev)
    xr = triton.next_power_of_2(max(p["nkb"]))
    slots = slots_arg or default_slots(xr)
    desc = TensorDescriptor(packed.view(-1, BOX[1]), [p["n_chunks"] * BOX[0], BOX[1]], [BOX[1], 1], BOX, W_LAYOUT)
    acts = torch.full((p["acts_len"],), float("nan"), dtype=torch.bfloat16, device=dev)  # poisoned outputs
    acts[:stages[0].K] = x0
    i32 = dict(dtype=torch.int32, device=dev)
    counters, done, err = torch.zeros(S, **i32), torch.zeros(1, **i32), torch.zeros(8, **i32)
    epoch = torch.ones(1, **i32)
    kargs = (desc, acts, p["wtab"], p["stab"], p["chunk_off"], counters, epoch, done, err, S)
    kw = dict(SLOTS=slots, XR=xr, BARS=bar_offset(slots, xr), WAIT_NS=WAIT_NS, num_warps=4)

    def launch(deps: bool):
        stream_kernel[(W,)](*kargs, DEPS=deps, **kw)

    for deps in {True, *variants}:
        check_barrier_offsets(stream_kernel.warmup(*kargs, grid=(W,), DEPS=deps, **kw).asm["llir"], kw["BARS"], slots)
    launch(True)  # correctness is always checked with the dependencies on (nodeps races by design)
    torch.cuda.synchronize()
    outs = [acts[o:o + st.N] for o, st in zip(p["out_off"], stages)]
    errs, ok = check_stages(stages, ws, x0, outs)
    ok = ok and err[0].item() == 0
    print(f"{name} W={W} slots={slots}  check: {'PASS' if ok else 'FAIL'}  "
          f"max rel err {max(errs):.2e} (stage {stages[errs.index(max(errs))].name})  errors: {describe(err.tolist())}",
          flush=True)
    return launch, p, slots, err, ok, errs


def main() -> None:
    args = parse_args("Warp-specialised Gluon weight-streaming prototype (see the module docstring).",
                      {"--tiny-check": "first run the tiny preset with 2 workers and print its check and errors"})
    if args.compile_only:
        return compile_only(args)
    dev = torch.device("cuda")
    if args.tiny_check:
        first_run("tiny", stages_for("tiny"), 2, None, [True], dev)
    W, stages = args.workers, stages_for(args.preset, args.layers)
    launch, p, slots, err, ok, errs = first_run(args.preset, stages, W, args.slots, [args.variant == "deps"], dev)
    if err[0].item():
        sys.exit("not timing: a wait failed (error record above)")
    ms = time_launches(lambda: launch(args.variant == "deps"), graph=args.graph)
    wbytes = sum(2 * st.N * st.K for st in stages)
    gbs = wbytes / (ms * 1e-3) / 1e9
    copy = copy_bandwidth_gbs()
    print(f"{args.preset} {args.variant} W={W} slots={slots}: {ms:.4f} ms/step  {gbs:.0f} GB/s weights  "
          f"copy {copy:.0f} GB/s  -> {100 * gbs / copy:.1f}% of copy  (errors: {describe(err.tolist())})")
    write_record(args.out, dict(
        impl="gluon_ws", preset=args.preset, layers=len(stages) // 4, variant=args.variant, W=W, ring_slots=slots,
        graph=args.graph, ms=ms, weight_GBps=gbs, copy_GBps=copy, pct_copy=100 * gbs / copy,
        weight_bytes=wbytes, streamed_bytes=p["n_chunks"] * ROW_GROUP * CK * 2, check_pass=ok,
        max_rel_err=max(errs), stage_errors=errs, error=err.tolist(), triton=triton.__version__,
        gpu=torch.cuda.get_device_name()))


if __name__ == "__main__":
    main()
