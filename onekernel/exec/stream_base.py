"""What every part of the streaming megakernel (``exec.stream_device``) shares: the queue record's layout and the
task kinds, the error codes, the Triton-version aliases, and the synchronisation primitives (bounded
``ld.acquire`` spins on event counters, bounded mbarrier waits, a per-warp slot release, the first-failure error
record). Every wait is bounded; the first failure is recorded in err[0:5] = (code, task, a, b, c) (ERRORS); at
TP > 1 the first remote failure in err[ERR_RSLOT:ERR_RSLOT + 6] (``spin_peer``: ``ld.acquire.sys`` on a peer's
counters), the Triton megakernel's layout.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# Triton 3.6 -> 3.8/3.9 renames: the CTA-wide barrier (gl.thread_barrier -> gl.barrier) and a shared-memory view of
# another shape (_reinterpret -> reinterpret).
barrier = getattr(gl, "thread_barrier", None) or gl.barrier
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def view(desc, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return desc.reinterpret(dtype, shape, layout)
else:
    @gluon.jit
    def view(desc, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return desc._reinterpret(dtype, shape, layout)

# Triton 3.6 reinterprets subviews and views of another size (attention's warp-merge scratch as session 12 measured
# it, stream_attn._merge_views); 3.8 only whole buffers of the same size, then subviews of the view.
SUBVIEW_REINTERPRET = gl.constexpr(tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 8))

_c = gl.constexpr
# Task kinds (record field F_KIND).
K_EMBED, K_RESID, K_GATEUP, K_QKV, K_LMHEAD, K_ATTN, K_MERGE, K_ARGMAX, K_ALLREDUCE = (_c(i) for i in range(9))
# Record fields (int32 [n_positions + 1, REC]); the per-op buffer offsets are in argtab (16-byte units).
(F_KIND, F_OP, F_TASK, F_SIGNAL, F_WB, F_WE, F_EV0, F_EX0, F_TILE, F_U0, F_NU, F_K, F_NKB, F_N,
 F_IDX) = (_c(i) for i in range(15))
REC = _c(16)
# Tensor parallel (read only when the kernel's constexpr TP is on): F_SYS = 1 when another rank waits on the
# task's signal (a system-scope release); an all-reduce task (no GEMV units) keeps its remote waits
# rwl[F_RWB:F_RWE] = (event, expected, peer rank) in the unit fields, and in F_N whether it adds a residual.
F_SYS = _c(15)
F_RWB, F_RWE, F_RES = F_U0, F_NU, F_N
# A GEMV task (no graph tile: F_IDX is its index in its op) keeps in F_TILE whether it has RMSNorm partials
# (exec.stream_plan.SS_PARTIALS): a residual task stores its outputs' per-row sums of squares at column F_IDX of its
# op's "ss" buffer; an RMSNorm'd task takes its rstd from its producer's (stream_stage.rstd_partials)
F_SS = F_TILE
# the "ss" buffer's slot in a GEMV op's arguments (exec.stream_plan.ROLES, which asserts them): after each kind's own
# buffers; gate_up and the residual GEMV at SS_ARG (the kernel: stream_epilogue.ss_buffer)
SS_ARG, SS_ARG_LM, SS_ARG_QKV = _c(3), _c(5), _c(9)
# err int32 [5] (TP: [ERR_RSLOT + 6]), the Triton megakernel's layout (exec.mk_device.ERR_RSLOT): err[0:5] the
# first local failure; at TP > 1 err[ERR_RSLOT:ERR_RSLOT + 6] = (5, task, event, seen, expected, peer rank), the
# first remote wait that gave up, in its own slot so that local waits timing out first (gpu-scope polls are faster
# than system-scope ones) cannot hide it; it then sets err[0] = ERR_STOP (if still 0) so the local spins stop.
ERR_RSLOT = _c(8)
ERR_STOP = _c(6)
# The streaming kernel's err continues with a slot per task: err[ERR_TASKS + 3 t : + 3] = (event + 1, seen, want) of
# task t's local wait that gave up (0: none). Every wait that was already pending when the first failure was recorded
# runs to its own time limit and fills its slot, so the host can tell the wait the step stopped at (no producer of
# its event gave up) from its consequences (exec.persistent: the first wait to give up on a small model was a
# consequence, run 19 call 192).
ERR_TASKS = _c(16)
ERRORS = {1: ("dependency wait", "event", "seen", "want"), 2: ("consumer ring wait", "chunk", "slot", "phase"),
          3: ("loader ring wait", "chunk", "slot", "phase"), 4: ("chunk count", "consumed", "streamed", "-")}


# ----------------------------------------------------------------------------------------------- MMA layouts
# gemv="mma": the consumer's 4 warps each take a CK/4 slice of a chunk; the batch is padded to 16 rows. The
# operands' shared layouts are defined here once, for the kernel (``mma_shared_layouts``) and for the host's
# packing (exec.stream_plan); constexpr functions (the kernel calls them while compiling; plain calls on the
# host; their source is part of the kernel's cache key).
MMA_WARPS, MMA_WARP_BITS = 4, 2
MMA_ROWS, MMA_ROW_BITS = 16, 4
# Independent accumulator chains per warp and chunk (split_k_bases): one chain of 16 dependent mma.sync per chunk
# (CK 1024) made the chunk's latency ~16 MMA latencies; 4 chains: Llama-3.2-1B 0.949 -> 0.896 ms at batch 1
# (run 11 call 100, one process per variant)
MMA_CHAINS = gl.constexpr(4)


@gluon.constexpr_function
def _swizzled_bases(rows_bits: int, ks: int, rows_dim: int, k_dim: int, rank: int = 3, swz_rows: int = 3,
                    outer_rows: int = 0) -> tuple:
    """Offset bases (Triton ``SharedLinearLayout``: offset bit j -> the logical coordinate it adds, XOR-combined)
    of a [4 warps, ...] operand buffer whose dims rows_dim (rows_bits bits) and k_dim (CK/4 = ks) hold one warp's
    slice: offset bits 0-5 are k bits 0-5 (a 128-byte line holds 64 k of one row), then the row bits, rows 1, 2
    and 4 (the first swz_rows of them) also flipping k bits 5, 3 and 4 (the 16-byte unit within the line: an
    ``ldmatrix`` phase, 8 rows at one unit, and a 16-byte ``ld.shared`` phase, 2 rows x 4 units, hit 8
    different units: no bank conflicts), then k bits 6.., then the warp, then the last outer_rows row bits
    (outermost, unswizzled: a slice of those rows is a contiguous part of the buffer). ks >= 64."""
    def v(d, x):
        c = [0] * rank
        c[d] = x
        return c
    swz = [32, 8, 16]
    bases = [v(k_dim, 1 << j) for j in range(6)]
    inner = rows_bits - outer_rows
    for j in range(inner):
        c = v(rows_dim, 1 << j)
        if j < min(3, swz_rows):
            c[k_dim] = swz[j]
        bases.append(c)
    bases += [v(k_dim, 1 << j) for j in range(6, ks.bit_length() - 1)]
    bases += [v(0, 1 << j) for j in range(MMA_WARP_BITS)]
    bases += [v(rows_dim, 1 << j) for j in range(inner, rows_bits)]
    return tuple(tuple(b) for b in bases)


@gluon.constexpr_function
def mma_async_a(B: int, CK: int) -> bool:
    """Whether the MMA path prefetches its activation tiles with cp.async into shared memory (exec.stream_stage.copy_a)
    rather than into registers: when a tile's 4-row quads hold more than 1024 values per 4-row group (CK = 1024: batch
    > 4). In registers, two quads (batch 5-8) left too few for the chunk loop, whose 8 `ldmatrix` of a chunk then
    waited on the previous chunk's MMAs (Llama-3.2-1B batch 8: 1.015 ms per step against 0.979 with cp.async, run 24
    call 240); batch 16 spilled 208 B. Only at CK >= 1024: the CK-512 kernels (tensor-parallel shards) keep their
    registers at every batch, as measured before (their raw tile at batch 9-12 would have 12 rows, which Gluon does not
    allocate)."""
    return CK >= 1024 and ((B + 3) // 4) * CK > 1024


@gluon.constexpr_function
def mma_direct_a(B: int, CK: int) -> bool:
    """Whether the cp.async prefetch copies each activation tile straight into the staged tile, where RMSNorm then
    runs in place (exec.stream_mma._mma_block), with no raw tile: above 8 batch rows at CK = 1024, where a raw tile
    of 16 rows (32 KB) cost two ring slots (Llama-3.2-1B batch 16: 1.138 ms per step against 1.189 with the raw tile;
    at batch 8 the 8-row raw tile measured as fast on Llama-3.2-1B and 2% faster on Llama-3.1-8B: run 24, calls 240
    and 241)."""
    return bool(mma_async_a(B, CK)) and ((B + 3) // 4) * CK > 2048


@gluon.constexpr_function
def mma_raw_tile(B: int, CK: int) -> bool:
    """Whether the MMA path has a raw activation tile (rbuf, mma_raw_rows rows) that its cp.async prefetch fills."""
    return bool(mma_async_a(B, CK)) and not bool(mma_direct_a(B, CK))


@gluon.constexpr_function
def mma_raw_rows(B: int) -> int:
    """Rows of the raw activation tile (mma_raw_tile): the 4-row quads that hold a batch row (16 at most)."""
    rows = 4 * ((int(B) + 3) // 4)
    return min(16, 1 << (rows - 1).bit_length())  # a power of two: Gluon's shared buffers need one


@gluon.constexpr_function
def mma_weight_bases(ck: int, rg: int) -> tuple:
    """The ring slot's layout for the MMA path: a chunk as [4, CK/4, RG] (warp, k, weight row), the B operand."""
    return _swizzled_bases(rg.bit_length() - 1, ck // MMA_WARPS, 2, 1)


@gluon.constexpr_function
def mma_act_bases(ck: int) -> tuple:
    """The staged activation tile's layout: [4, 16, CK/4] (warp, batch row, k), the A operand. Batch rows 4..15
    by quads are the outermost offset bits (the stager writes 4-row quads, slices of the buffer), so only rows
    0-3 are swizzled: A's ldmatrix phases (rows m and m + 4 share a unit) take 2 wavefronts where 1 would do,
    once per staged tile (A is loaded into registers once per GB chunks)."""
    return _swizzled_bases(MMA_ROW_BITS, ck // MMA_WARPS, 1, 2, swz_rows=2, outer_rows=2)


@gluon.constexpr_function
def split_k_bases(bases: tuple, k_dim: int, ks: int, split: int) -> tuple:
    """The bases of a [4, ..., CK/4, ...] operand buffer viewed as [4 * split, ..., CK/4/split, ...]: k's top
    log2(split) bits become the batch dimension's bits above the warp (batch b' = s * 4 + w holds k-slice w's
    part s), the buffer's bytes unchanged. An MMA over the view runs ``split`` independent accumulator chains per
    warp (mma_v2 repeats the batch over registers), each over CK/4/split of k."""
    sub = ks // split
    out = []
    for b in bases:
        c = list(b)
        hi, lo = c[k_dim] // sub, c[k_dim] % sub
        c[k_dim] = lo
        c[0] = c[0] + hi * MMA_WARPS
        out.append(c)
    return tuple(tuple(c) for c in out)


@gluon.constexpr_function
def mma_split(CK, want):
    """Independent accumulator chains per warp and chunk: ``want`` (MMA_CHAINS), at most CK/4/64 (split_k_bases
    keeps the 64-k lines and their swizzle whole: 1 for SmolLM2's CK 256)."""
    return max(1, min(int(want), CK // MMA_WARPS // 64))


@gluon.constexpr_function
def mma_shared_layouts(CK, RG, SPLIT=1):
    """(weight chunk layout [4, CK/4, RG], activation tile layout [4, 16, CK/4]) as Gluon SharedLinearLayouts;
    with SPLIT > 1 the same bytes viewed as [4 * SPLIT, CK/4/SPLIT, RG] and [4 * SPLIT, 16, CK/4/SPLIT]
    (split_k_bases: the MMA chains)."""
    w = split_k_bases(mma_weight_bases(CK, RG), 1, CK // MMA_WARPS, SPLIT)
    a = split_k_bases(mma_act_bases(CK), 2, CK // MMA_WARPS, SPLIT)
    return (gl.SharedLinearLayout([list(b) for b in w]), gl.SharedLinearLayout([list(b) for b in a]))


# ----------------------------------------------------------------------------------------------- primitives
@gluon.jit
def ld_acquire(p):
    return gl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [p], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def smem_addr(offset):
    """Shared address of byte ``offset`` of the dynamic shared memory: Gluon has no non-blocking mbarrier wait,
    so the bounded waits address the mbarriers at the offset Triton allocates them (found after compiling:
    stream_runner.fit_kernel)."""
    return gl.inline_asm_elementwise("{ .reg .u32 b; mov.u32 b, global_smem; add.u32 $0, b, $1; }", "=r,r",
                                     [offset], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def record(err, code, t, a, b, c):
    """The first failure claims err[0] and writes err[0:5] = (code, task, a, b, c); per thread, barrier-free."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 z; mov.b32 z, 0; atom.global.relaxed.gpu.cas.b32 $0, [$1], z, $2;"
        " setp.eq.b32 p, $0, 0; @p st.global.b32 [$1+4], $3; @p st.global.b32 [$1+8], $4;"
        " @p st.global.b32 [$1+12], $5; @p st.global.b32 [$1+16], $6; }",
        "=r,l,r,r,r,r,r", [err, code, t, a, b, c], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def record_task(err, t, ev, seen, want):
    """Task t's slot err[ERR_TASKS + 3 t : + 3] = (ev + 1, seen, want): a local wait of t gave up."""
    p = err + ERR_TASKS + 3 * t
    gl.store(p, ev + 1)
    gl.store(p + 1, seen)
    gl.store(p + 2, want)


@gluon.jit
def ld_acquire_sys(p):
    """``ld.acquire.sys`` of one int32: pairs with another GPU's ``atom.release.sys`` on that address (a peer's
    event counter in symmetric memory, over NVLink); this thread's later loads see what the peer's CTA stored
    before its release (its CTA barrier, then the release: cumulativity)."""
    return gl.inline_asm_elementwise("ld.global.acquire.sys.b32 $0, [$1];", "=r,l", [p], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def record_remote(err, t, ev, seen, want, peer):
    """The first remote failure claims err[8] (ERR_RSLOT) and writes err[8:14] = (5, task, event, seen, want,
    peer), then err[0] = 6 (ERR_STOP) unless a local failure is recorded there (per thread, barrier-free)."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 z, c, s, o; mov.b32 z, 0; mov.b32 c, 5; mov.b32 s, 6;"
        " atom.global.relaxed.gpu.cas.b32 $0, [$1+32], z, c; setp.eq.b32 p, $0, 0;"
        " @p st.global.b32 [$1+36], $2; @p st.global.b32 [$1+40], $3; @p st.global.b32 [$1+44], $4;"
        " @p st.global.b32 [$1+48], $5; @p st.global.b32 [$1+52], $6;"
        " @p atom.global.relaxed.gpu.cas.b32 o, [$1], z, s; }",
        "=r,l,r,r,r,r,r", [err, t, ev, seen, want, peer], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def try_wait(addr, parity):
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.b32 $0, 1, 0, p; }",
        "=r,r,r", [addr, parity], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def bulk_load(dst, src, nbytes, bar, ok):
    """Lane 0, where ok != 0: ``cp.async.bulk`` of the ``nbytes`` at global address ``src`` into shared address
    ``dst``, completing ``nbytes`` of transactions on the mbarrier at shared address ``bar`` (the caller's
    ``mbarrier.expect``), under an L2 ``evict_first`` cache policy (``createpolicy``): the weight stream, read once per
    step, is the first to leave L2, so the KV cache and the activations stay (docs/DESIGN.md, "The weight stream leaves
    L2 first"). Gluon's TMA load takes no cache policy; the chunk is stored in box order, so a 1-D copy moves the
    bytes the TMA tensor copy of its box did."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 l; .reg .b64 pol; mov.u32 l, %laneid; setp.eq.u32 p, l, 0;"
        " setp.ne.and.b32 p, $5, 0, p; createpolicy.fractional.L2::evict_first.b64 pol, 1.0;"
        " @p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [$1], [$2], $3, [$4],"
        " pol; mov.b32 $0, 0; }",
        "=r,r,l,r,r,r", [dst, src, nbytes, bar, ok], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def wait_bounded(ok, addr, parity, err, code, t, i, slot, WAIT_NS: gl.constexpr):
    """Bounded mbarrier wait (skipped unless ok); 0 after recording a timeout (then the caller skips the rest)."""
    if ok != 0:
        ok = try_wait(addr, parity)
        if ok == 0:
            t0 = now()
            tn = t0
            while (ok == 0) & (tn - t0 < WAIT_NS):
                ok = try_wait(addr, parity)
                tn = now()
            if ok == 0:
                record(err, code, t, i, slot, parity)
    return ok


@gluon.jit
def _spin(cnt, want, stop, err, t, ev, peer, WAIT_NS: gl.constexpr, SYS: gl.constexpr):
    """Spin until cnt[0] >= want (every thread; ``ld.acquire.sys`` with SYS, else ``ld.acquire.gpu``), for at
    most WAIT_NS and not once *stop != 0 (read every 256 polls: another failure was recorded; a local wait reads it
    only in its first WAIT_NS / 2, so the waits pending when the first failure is recorded reach their own limits).
    On timeout: ``record_remote`` (SYS) or ``record`` (1, task, event, seen, want) and the task's slot
    (``record_task``)."""
    if SYS:
        seen = ld_acquire_sys(cnt)
    else:
        seen = ld_acquire(cnt)
    if seen < want:
        t0 = now()
        tn = t0
        n = 0
        bad = 0
        while (seen < want) & (bad == 0) & (tn - t0 < WAIT_NS):
            if SYS:
                seen = ld_acquire_sys(cnt)
            else:
                seen = ld_acquire(cnt)
            tn = now()
            n += 1
            if n % 256 == 0:
                if SYS:
                    bad = gl.load(stop, volatile=True)
                elif tn - t0 < WAIT_NS // 2:
                    bad = gl.load(stop, volatile=True)
        if (seen < want) & (bad == 0):
            if SYS:
                record_remote(err, t, ev, seen, want, peer)
            else:
                record(err, 1, t, ev, seen, want)
                record_task(err, t, ev, seen, want)


@gluon.jit
def spin(cnt, want, err, t, ev, WAIT_NS: gl.constexpr):
    """Spin until the local counter cnt[0] >= want (``ld.acquire.gpu``), for at most WAIT_NS and not once another
    failure is recorded (err[0]); on timeout ``record`` (_spin)."""
    _spin(cnt, want, err, err, t, ev, 0, WAIT_NS, False)


@gluon.jit
def spin_peer(cnt, want, err, t, ev, peer, WAIT_NS: gl.constexpr):
    """Spin until the peer counter cnt[0] >= want (``ld.acquire.sys``), for at most WAIT_NS and not once another
    remote failure is recorded (err[ERR_RSLOT]; a local failure in err[0] does not stop it: the remote cause is
    then still recorded); on timeout ``record_remote`` (_spin)."""
    _spin(cnt, want, err + ERR_RSLOT, err, t, ev, peer, WAIT_NS, True)


@gluon.jit
def wait_remote(rec, rwl, peer_off, ev_cnt, err, epoch, t, WAIT_NS: gl.constexpr):
    """Spin on every remote wait of the task at ``rec``: rwl[F_RWB:F_RWE] = (event, expected, peer), each on
    that rank's counters at ev_cnt + peer_off[peer] (int32 elements; one virtual address space)."""
    for j in range(gl.load(rec + F_RWB), gl.load(rec + F_RWE)):
        e = gl.load(rwl + 3 * j)
        peer = gl.load(rwl + 3 * j + 2)
        spin_peer(ev_cnt + gl.load(peer_off + peer) + e, gl.load(rwl + 3 * j + 1) * epoch, err, t, e, peer, WAIT_NS)


@gluon.jit
def push_rows(p, y, m, pdelta, NR: gl.constexpr):
    """Push (tensor parallel, constexpr PUSH): store y (the values just stored at the pointers ``p``, mask ``m``)
    at the same offset in every peer's pool: ``p + pdelta[q]`` for q < NR, pdelta int64 [NR] = elements of y's
    dtype from this rank's pool to rank q's (0 for this rank, skipped; dist/tp_megakernel.py lays the pools out
    alike). The stores are posted over NVLink; the task's signal (a system-scope release into each peer's
    counters, stream_device) orders them before the peer's reads."""
    for q in gl.static_range(NR):
        d = gl.load(pdelta + q)
        if d != 0:
            gl.store(p + d, y, mask=m)


@gluon.jit
def warp_release(addr, ok):
    """Every lane: ``bar.warp.sync``, then lane 0 arrives on the mbarrier at shared address ``addr`` (count: one per
    consumer warp; ``mbarrier.arrive`` has release semantics, so the warp's reads of the slot are ordered before
    it), unless ok == 0. No CTA-wide barrier per chunk. No ``fence.proxy.async`` before it: the slot was only
    read (generic proxy) and its next write is the loader's bulk copy (async proxy) after its wait on this barrier, the order CUTLASS's
    ``PipelineTmaAsync::consumer_release`` relies on (a plain arrive); the fence compiled to ``MEMBAR.ALL.CTA`` per
    chunk and cost 0.8-1.6% of a Llama-3.2-1B step (run 11 call 100; the GPU tests and bitwise invariance pass
    without it)."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 l; bar.warp.sync -1; mov.u32 l, %laneid;"
        " setp.eq.u32 p, l, 0; setp.ne.and.b32 p, $2, 0, p; @p mbarrier.arrive.shared::cta.b64 _, [$1];"
        " mov.b32 $0, 0; }", "=r,r,r", [addr, ok], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE: gl.constexpr, WAIT_NS: gl.constexpr):
    """Spin on every event the task at ``rec`` waits for (the first from the record, the rest from ``wl``);
    with PROFILE, stamp the time the last one was satisfied."""
    wb = gl.load(rec + F_WB)
    we = gl.load(rec + F_WE)
    if we > wb:
        e0 = gl.load(rec + F_EV0)
        spin(ev_cnt + e0, gl.load(rec + F_EX0) * epoch, err, t, e0, WAIT_NS)
        for j in range(wb + 1, we):
            e = gl.load(wl + 2 * j)
            spin(ev_cnt + e, gl.load(wl + 2 * j + 1) * epoch, err, t, e, WAIT_NS)
    if PROFILE:
        gl.store(prof + t * 4 + 1, now())


