"""The streaming megakernel's weight stream (exec/stream_pack.py over a plan of exec/stream_plan.py) on the CPU:
its contents, its shared-memory layouts on the tensor-core path, and one stream per model (the plan itself:
tests/test_stream_plan.py).

The GEMV tasks are emulated from the packed weight stream with the device code's row formulas (written again
here from exec/stream_device.py, not taken from the planner) and compared with ``W @ x`` for random weights
and activations: a wrong unit split, chunk order, padding or row mapping changes some output row.
The device code itself runs on a GPU only (tests/test_stream_gpu.py).
"""
import pytest
import torch

from onekernel.exec import stream_base as sd
from onekernel.exec.stream_pack import pack_weights
from onekernel.exec.stream_plan import CHUNK_ELEMS, make_plan
from onekernel.exec.stream_support import chunk_cols
from test_stream_plan import CFG, CFG8, CFGQ, _step


def _device_rows(kind, u, p, rg):
    """Output rows of unit u's chunk groups, as stream_fma.gemv_fma maps them (None: rows of another kind)."""
    r = torch.arange(rg)
    if kind == sd.K_QKV.value:
        P, ch = rg // 2, p["HD"] // rg
        h, c = u // ch, u % ch
        return [h * p["HD"] + (r // P) * (p["HD"] // 2) + c * P + (r % P)]
    base = u * rg + r
    if kind == sd.K_GATEUP.value:
        return [base, base + p["N"]]  # gate group, then up group (rows of cat(w_gate, w_up))
    return [base]


@pytest.mark.parametrize("batch", [1, 3])
def test_packed_stream_reproduces_every_gemv(batch, seed):
    step, W = _step(batch, seed)
    plan = make_plan(step, W)
    packed, off = pack_weights(plan, step.tensors)
    c = plan.consts
    rg, ck = c["RG"], c["CK"]
    assert rg * ck == CHUNK_ELEMS and ck == chunk_cols([128, 256, 384]) == 256

    def decode(o, t, op, kind):  # chunk kb of a group: its rows x columns kb*CK.., row-major
        u0, nu = plan.units[t]
        nkb, groups = op.params["NKB"], []
        for u in range(u0, u0 + nu):
            for rows in _device_rows(kind, u, op.params, rg):
                groups.append((rows, packed[o:o + nkb].double().transpose(0, 1).reshape(rg, nkb * ck)))
                o += nkb
        return o, groups

    _check_stream(plan, step, off, seed, decode)


def _check_stream(plan, step, off, seed, decode):
    """Walk every worker's GEMV tasks in queue order: ``decode(o, task, op, kind)`` -> (the offset after the
    task's chunks, [(weight rows, their chunks as [RG, NKB * CK] float64)]); then every output row of every GEMV
    op is made exactly once, the padding past K and the rows past N stream as zeros, each worker consumes exactly
    its own chunks, and y == W @ x for a seeded x (float64, 1e-12)."""
    g = torch.Generator().manual_seed(seed)
    outs, seen = {}, {}
    for w, queue in enumerate(plan.schedule.queues):
        o = int(off[w])
        for t in queue:
            op = plan.graph.ops[plan.graph.tasks[t].op]
            kind = plan.kinds[op.index]
            if kind not in (sd.K_RESID.value, sd.K_GATEUP.value, sd.K_QKV.value, sd.K_LMHEAD.value):
                continue
            n, k = step.tensors[plan.weight_of[op.index]].shape
            if op.index not in outs:
                outs[op.index] = (torch.randn(k, generator=g, dtype=torch.float64),
                                  torch.full((n,), float("nan"), dtype=torch.float64))
                seen[op.index] = torch.zeros(n, dtype=torch.long)
            x, y = outs[op.index]
            o, groups = decode(o, t, op, kind)
            for rows, m in groups:
                assert not m.isnan().any()
                assert not m[:, k:].any(), f"{op.name}: the padding past K={k} is not zero"
                live = rows < n
                y[rows[live]] = m[live, :k] @ x
                seen[op.index][rows[live]] += 1
                assert not m[~live].any(), f"{op.name}: rows past N={n} must stream as zeros"
        assert o == int(off[w + 1]), f"worker {w} consumed {o - int(off[w])} chunks, streams {int(off[w + 1] - off[w])}"
    for oi, (x, y) in outs.items():
        name = plan.graph.ops[oi].name
        assert (seen[oi] == 1).all(), f"{name}: rows covered {seen[oi].min()}..{seen[oi].max()} times, want once"
        torch.testing.assert_close(y, step.tensors[plan.weight_of[oi]].double() @ x, rtol=1e-12, atol=1e-12,
                                   msg=name)


def _slot_coords(bases, n):
    """[n, 3] logical (warp, k, row) of each offset of a ring slot read through SharedLinearLayout(bases): the
    XOR of the bases of the offset's set bits (Triton's linear-layout definition), written again here."""
    off = torch.arange(n)
    out = torch.zeros(n, 3, dtype=torch.long)
    for j, b in enumerate(bases):
        out ^= ((off >> j) & 1)[:, None] * torch.tensor(b)[None, :]
    return out


@pytest.mark.parametrize("cfg,batch", [(CFG, 1), (CFG, 3), (CFG8, 2), (CFGQ, 3)])
def test_mma_stream_reproduces_every_gemv(cfg, batch, seed):
    """gemv="mma": per task, k-major blocks of GB chunk groups (gate_up: GB / 2 units), each chunk read through
    the kernel's shared layout as [4 warps, CK/4, RG] (stream_mma._mma_block: warp w multiplies columns
    w*CK/4 + k of weight row n): every output row exactly once, exactly W @ x."""
    step, W = _step(batch, seed, cfg=cfg, gemv="mma")
    plan = make_plan(step, W)
    packed, off = pack_weights(plan, step.tensors)
    c = plan.consts
    rg, ck, gb = c["RG"], c["CK"], c["GB"]
    from onekernel.exec.stream_base import mma_weight_bases
    assert c["MMA"] and rg * ck == CHUNK_ELEMS and gb * rg == 64 and gb % 2 == 0
    ks = ck // 4
    co = _slot_coords(mma_weight_bases(ck, rg), CHUNK_ELEMS)
    assert torch.unique(co[:, 2] * ck + co[:, 0] * ks + co[:, 1]).numel() == CHUNK_ELEMS  # a bijection
    rows_of, cols_of = co[:, 2], co[:, 0] * ks + co[:, 1]

    def decode(o, t, op, kind):  # k-major blocks of groups, each chunk read through the kernel's shared layout
        u0, nu = plan.units[t]
        nkb, out = op.params["NKB"], []
        ub_n = gb // (2 if kind == sd.K_GATEUP.value else 1)
        for ub in range(u0, u0 + nu, ub_n):
            groups = [rows for u in range(ub, min(ub + ub_n, u0 + nu)) for rows in _device_rows(kind, u, op.params, rg)]
            wg = [torch.full((rg, nkb * ck), float("nan"), dtype=torch.float64) for _ in groups]
            for kb in range(nkb):
                for j in range(len(groups)):
                    wg[j][rows_of, kb * ck + cols_of] = packed[o].reshape(-1).double()
                    o += 1
            out += zip(groups, wg)
        return o, out

    _check_stream(plan, step, off, seed, decode)


@pytest.mark.parametrize("ck,rg", [(1024, 8), (256, 32), (512, 16)])
def test_mma_operand_layouts_are_free_of_bank_conflicts(ck, rg):
    """The MMA operands' shared layouts (stream_plan.mma_weight_bases / mma_act_bases) as ``ldmatrix`` reads
    them: one phase = 8 rows x 16 bytes at one k. Weights: the 8 rows of a phase in 8 different 16-byte units of
    the 128-byte bank line (1 wavefront); activations: at most 2 rows per unit (rows m and m + 4)."""
    from onekernel.exec.stream_base import mma_act_bases, mma_weight_bases
    ks = ck // 4
    for bases, rows, dims, want in ((mma_weight_bases(ck, rg), rg, (1, 2), 1), (mma_act_bases(ck), 16, (2, 1), 2)):
        co = _slot_coords(bases, 4 * ks * rows)
        kd, rd = dims
        where = {tuple(v): o for o, v in enumerate(co.tolist())}
        worst = 0
        for w in range(4):
            for k0 in range(0, ks, 8):
                for r0 in range(0, rows, 8):
                    units = []
                    for r in range(r0, r0 + 8):
                        v = [w, 0, 0]
                        v[kd], v[rd] = k0, r
                        o = where[tuple(v)]
                        assert o % 8 == 0  # 8 consecutive k in one 16-byte unit
                        units.append((o // 8) % 8)
                    worst = max(worst, max(units.count(u) for u in units))
        assert worst == want, (ck, rg, rows, worst)


@pytest.mark.parametrize("ck,rg", [(1024, 8), (256, 32), (512, 16)])
def test_mma_split_views_address_the_same_bytes(ck, rg):
    """The MMA chains' views (stream_base.split_k_bases, mma_shared_layouts(CK, RG, SP)): read as [4 * SP, CK/4/SP, ...], every
    offset of the slot and of the staged tile holds the element of the unsplit layout at warp b % 4 and k =
    (b // 4) * CK/4/SP + k' (so chain s of warp w multiplies exactly k-quarter s of the warp's slice), for every
    SP the kernel may take (mma_split: at most CK/4/64, the swizzled 64-k lines kept whole)."""
    from onekernel.exec.stream_base import mma_act_bases, mma_split, mma_weight_bases, split_k_bases
    ks = ck // 4
    assert mma_split(ck, 4) == min(4, ks // 64) and mma_split(ck, 1) == 1
    for sp in {1, 2, mma_split(ck, 4)}:
        if ks // sp < 64:
            continue
        sub = ks // sp
        for bases, kd, n in ((mma_weight_bases(ck, rg), 1, 4 * ks * rg), (mma_act_bases(ck), 2, 4 * ks * 16)):
            whole = _slot_coords(bases, n)
            split = _slot_coords(split_k_bases(bases, kd, ks, sp), n)
            assert split[:, 0].max() == 4 * sp - 1 and split[:, kd].max() == sub - 1
            back = split.clone()
            back[:, 0] = split[:, 0] % 4
            back[:, kd] = (split[:, 0] // 4) * sub + split[:, kd]
            assert torch.equal(back, whole), (ck, rg, sp, kd)
            assert len({tuple(v) for v in split.tolist()}) == n  # one offset per element of the view


def test_weight_stream_does_not_depend_on_the_batch(seed):
    """Runners of several batch sizes over the same weights share one packed stream (exec.stream_runner
    .shared_stream): valid only because the stream and its offsets are the same for every batch size."""
    streams = []
    for batch in (1, 4, 16):
        step, W = _step(batch, seed)
        streams.append(pack_weights(make_plan(step, W), step.tensors))
    for packed, off in streams[1:]:
        assert torch.equal(packed, streams[0][0]) and torch.equal(off, streams[0][1])


def test_runners_of_one_model_share_one_stream_while_they_hold_it(seed):
    import gc

    from onekernel.exec.stream_runner import _STREAMS, shared_stream
    step1, W = _step(1, seed)
    step4, _ = _step(4, seed)  # the same seed: equal weights, but other tensors: another stream
    a = shared_stream(make_plan(step1, W), step1.tensors)
    assert shared_stream(make_plan(step1, W), step1.tensors) is a
    b = shared_stream(make_plan(step4, W), step4.tensors)
    assert b is not a and torch.equal(b.packed, a.packed)
    n = len(_STREAMS)
    del a, b
    gc.collect()
    assert len(_STREAMS) == n - 2, "a stream no runner holds must be freed"
