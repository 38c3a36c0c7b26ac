"""``qkv_rope``: RMSNorm + fused QKV GEMV + (Qwen3) per-head q/k RMSNorm + RoPE + KV-cache append.

Shapes (model dtype dt, layer i): x ``x.{i}`` [B, D]; attn_norm [D]; ``wqkv`` = cat(wq, wk, wv)
[(Hq + 2 Hkv) * hd, D]; rope_inv_freq fp32 [hd/2]; seq_lens int32 [B]; q_norm/k_norm [hd] (Qwen3);
outputs q ``q.{i}`` [B, Hq, hd], ``k_cache``/``v_cache`` [B, Hkv, S, hd] written at row seq_lens[b].

Math (HF modeling_llama.py / modeling_qwen3.py, every step rounded to dt where HF rounds):
    h = LlamaRMSNorm(x);  y = (h @ wqkv^T).to(dt) viewed as heads [B, Hq + 2 Hkv, hd]
    Qwen3: q, k heads = RMSNorm_hd(q) * q_norm, RMSNorm_hd(k) * k_norm         (Qwen3Attention q_norm)
    RoPE (apply_rotary_pos_emb, rotate_half form), pos = seq_lens[b], f = pos * inv_freq  (fp32):
        cos = cat(cos f, cos f).to(dt), sin likewise;  q' = (q*cos).to(dt) + (rotate_half(q)*sin).to(dt)
        rotate_half(q) = cat(-q[hd/2:], q[:hd/2])
Unit = one head h and one chunk c of P rotation pairs: head rows {c*P..c*P+P} and {hd/2+c*P..hd/2+c*P+P}
(P = hd/2, i.e. the whole head, when QK_NORM). Units are numbered u = h * (hd / 2P) + c, q heads first,
then k heads, then v heads (no RoPE/norm on v); tile t holds the U units t*U .. t*U+U-1 (``qkv_tiles``: U > 1 only
on the separate kernels' tensor-core path, where it evens out the weight bytes per SM). P, U and BLOCK_K never
depend on B and the QKV dot products
and the q/k RMSNorm sums are per-row reductions of B-independent shape (batch invariance, ops/gemv_rows.py;
with ``MMA`` the products run on the tensor cores, ops/gemv_mma.py, and the q/k sums reduce each row of a
[16, hd] tile). cos/sin use libdevice (exact range reduction, positions up
to 128k) on the GPU; the interpreter has no libdevice and uses tl.cos/tl.sin (numpy).

PRENORM (the separate kernels' tensor-core path in one wave of tiles, ``add_qkv_rope``'s default there; gate_up's too):
a tile first writes h = LlamaRMSNorm(x) once, rows b < B, to its own row of the scratch ``xn`` [B, n_tiles, D]
(``tiling.prenorm_scratch``; ``gemv_rows.rms_norm_rows``: the values the in-loop normalisation gives), then runs the
residual GEMVs' chunk loop on it: no norm arithmetic per chunk, so Triton's pipeliner keeps STAGES - 1 chunks in flight
(``tiling.prenorm_pipeline``). Without it the chunk loop normalises each [16, BLOCK_K] activation tile (16 padded rows
whatever B is). docs/DESIGN.md, "qkv_rope's and gate_up's RMSNorm once per tile", has the measurements.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from onekernel.graph.ir import Buffer, Graph, Op, Task
from onekernel.ops.base import OpKind
from onekernel.ops.gemv_rows import (PRECISE_MATH, gemv_rows, gemv_rows_t, load_w_chunk, rms_norm_ref, rms_norm_rows,
                                     rms_rstd, rnd, stack_rows)
from onekernel.ops.gemv_mma import gemv_mma, mma_stages
from onekernel.ops.tiling import (MAX_TILE_ELEMS, MMA_COLS, MMA_MIN, Tiling, batch_block, block_k_for, cdiv, check_gemv,
                                  pow2_ceil, prenorm_default, prenorm_pipeline, prenorm_scratch, region)

@triton.jit
def _qkv_rows(tile, HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, P: tl.constexpr, U: tl.constexpr):
    """Per row of a tile's [2 UP P] rows (UP = next_pow2(U)): (head h, chunk c, head-local row hr, global weight
    row int64, live). Row i = half * UP P + s * P + p: slot s holds unit t U + s (a unit = one head h and one
    chunk c of P rotation pairs, u = h * (hd / 2P) + c), half 0 its rows c P + p, half 1 its rows hd/2 + c P + p;
    rows of slots >= U or of units past the last are dead (masked, clamped to head 0)."""
    CH: tl.constexpr = HD // (2 * P)
    UP: tl.constexpr = triton.next_power_of_2(U)
    i = tl.arange(0, 2 * UP * P)
    s = (i // P) % UP
    unit = tile * U + s
    live = (s < U) & (unit < (HQ + 2 * HKV) * CH)
    unit = tl.where(live, unit, 0)
    h = unit // CH
    hr = (i // (UP * P)) * (HD // 2) + (unit % CH) * P + (i % P)
    return h, unit % CH, hr, h.to(tl.int64) * HD + hr, live


@triton.jit
def qkv_rope_prologue(tile, x, nw, w, inv_freq, seq_lens, qn, kn, xn, q, k_cache, v_cache,
                      B: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                      S: tl.constexpr, P: tl.constexpr, U: tl.constexpr, BLOCK_B: tl.constexpr,
                      BLOCK_K: tl.constexpr, EPS: tl.constexpr, QK_NORM: tl.constexpr, MMA: tl.constexpr,
                      STAGES: tl.constexpr, PRENORM: tl.constexpr):
    h, c, hr, rows, live = _qkv_rows(tile, HQ, HKV, HD, P, U)
    return load_w_chunk(w, rows, live, 0, D, BLOCK_K)


@triton.jit
def qkv_rope_body(tile, w0, x, nw, w, inv_freq, seq_lens, qn, kn, xn, q, k_cache, v_cache,
                  B: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                  S: tl.constexpr, P: tl.constexpr, U: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
                  EPS: tl.constexpr, QK_NORM: tl.constexpr, MMA: tl.constexpr, STAGES: tl.constexpr,
                  PRENORM: tl.constexpr):
    UP: tl.constexpr = triton.next_power_of_2(U)
    R: tl.constexpr = 2 * UP * P  # the tile's rows (module doc), U * 2P of them live
    h, c, hr, rows, live = _qkv_rows(tile, HQ, HKV, HD, P, U)
    dt = q.dtype.element_ty
    ob = tl.arange(0, BLOCK_B)
    bm = ob < B
    pos = tl.load(seq_lens + ob, mask=bm, other=0, cache_modifier=".cg")  # RoPE's inputs before the GEMV: off its tail
    fi = c * P + (tl.arange(0, R) % P)
    ang = pos.to(tl.float32)[:, None] * tl.load(inv_freq + fi)[None, :]
    if PRECISE_MATH:
        cs = rnd(libdevice.cos(ang), dt)
        sn = rnd(libdevice.sin(ang), dt)
    else:
        cs = rnd(tl.cos(ang), dt)
        sn = rnd(tl.sin(ang), dt)
    if PRENORM:  # the tile's own copy of RMSNorm(x) in xn[tile], written once; the chunk loop then only loads it
        NT: tl.constexpr = ((HQ + 2 * HKV) * (HD // (2 * P)) + U - 1) // U  # the op's tiles
        xs = xn + tile.to(tl.int64) * D  # xn [B, NT, D]: row b of this tile at (b NT + tile) D
        rms_norm_rows(x, nw, xs, B, D, EPS, NT * D)
        tl.debug_barrier()
        rstd = tl.zeros([BLOCK_B], tl.float32)
    else:
        rstd = rms_rstd(x, B, D, BLOCK_B, EPS)
    is_q = h < HQ
    is_k = (h >= HQ) & (h < HQ + HKV)
    is_v = h >= HQ + HKV
    if QK_NORM:  # the tile holds one whole head (P == HD // 2, U == 1): q or k norm weights of its rows
        g = tl.where(is_q, tl.load(qn + hr).to(tl.float32), tl.load(kn + hr).to(tl.float32))
    if MMA:  # tensor cores (ops/gemv_mma.py), BLOCK_B = 16: y [16, R] has the same shape for every B
        if PRENORM:
            y = rnd(gemv_mma(w0, xs, nw, rstd, w, rows, live, B, D, R, BLOCK_K, False, STAGES, NT * D), dt)
        else:
            y = rnd(gemv_mma(w0, x, nw, rstd, w, rows, live, B, D, R, BLOCK_K, True, STAGES), dt)
        if QK_NORM:  # per-row sums over a [16, HD] tile: a shape and layout that never depend on B
            rb = tl.math.rsqrt(tl.sum(y * y, axis=1) / HD + EPS)
            y = tl.where(is_v[None, :], y, rnd(rnd(y * rb[:, None], dt) * g[None, :], dt))
    elif QK_NORM:  # per-row [2P] sums (batch-invariant)
        acc = gemv_rows_t(w0, x, nw, rstd, w, rows, live, B, D, BLOCK_B, R, BLOCK_K, True)
        ys = ()
        for b in tl.static_range(B):
            yb = rnd(acc[b], dt)
            rb = tl.math.rsqrt(tl.sum(yb * yb, axis=0) / HD + EPS)
            ys = ys + (tl.where(is_v, yb, rnd(rnd(yb * rb, dt) * g, dt)),)
        y = stack_rows(ys, B, BLOCK_B, R)
    else:
        acc = gemv_rows(w0, x, nw, rstd, w, rows, live, B, D, BLOCK_B, R, BLOCK_K, True)
        y = rnd(acc, dt)  # [BLOCK_B, R]
    y3 = tl.reshape(y, [BLOCK_B, 2, UP * P])  # [half][slot, pair]: each row's rotation partner in the other half
    half = tl.arange(0, 2)[None, :, None]
    lo = tl.sum(tl.where(half == 0, y3, 0.0), axis=1)
    hi = tl.sum(tl.where(half == 1, y3, 0.0), axis=1)
    rot = tl.reshape(tl.where(half == 0, -hi[:, None, :], lo[:, None, :]), [BLOCK_B, R])
    yr = (rnd(y * cs, dt) + rnd(rot * sn, dt)).to(dt)
    out = tl.where(is_v[None, :], y.to(dt), yr)
    b64 = ob.to(tl.int64)[:, None]
    tl.store(q + b64 * (HQ * HD) + h[None, :] * HD + hr[None, :], out, mask=bm[:, None] & (is_q & live)[None, :])
    pm = (bm & (pos >= 0) & (pos < S))[:, None]
    hk = tl.minimum(tl.maximum(h - HQ, 0), HKV - 1)
    tl.store(k_cache + ((b64 * HKV + hk[None, :]) * S + pos[:, None]) * HD + hr[None, :], out,
             mask=pm & (is_k & live)[None, :])
    hv = tl.minimum(tl.maximum(h - HQ - HKV, 0), HKV - 1)
    tl.store(v_cache + ((b64 * HKV + hv[None, :]) * S + pos[:, None]) * HD + hr[None, :], out,
             mask=pm & (is_v & live)[None, :])


def rope_ref(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """HF apply_rotary_pos_emb for x [B, H, hd] at positions pos [B] (cos/sin fp32 -> x.dtype)."""
    f = pos.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((f, f), dim=-1)[:, None, :]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def qkv_rope_reference(op: Op, t: dict) -> None:
    a, p = op.args, op.params
    B, HQ, HKV, HD = p["B"], p["HQ"], p["HKV"], p["HD"]
    h = rms_norm_ref(t[a["x"]], t[a["nw"]], p["EPS"])
    if p.get("PRENORM"):  # every tile's scratch row holds the normalised activation
        t[a["xn"]].copy_(h[:, None, :].expand_as(t[a["xn"]]))
    y = F.linear(h, t[a["w"]]).view(B, HQ + 2 * HKV, HD)
    qh, kh, vh = y[:, :HQ], y[:, HQ:HQ + HKV], y[:, HQ + HKV:]
    if p["QK_NORM"]:
        qh, kh = rms_norm_ref(qh, t[a["qn"]], p["EPS"]), rms_norm_ref(kh, t[a["kn"]], p["EPS"])
    pos = t[a["seq_lens"]].long()
    bidx = torch.arange(B, device=pos.device)
    t[a["q"]].copy_(rope_ref(qh, pos, t[a["inv_freq"]]))
    t[a["k_cache"]][bidx, :, pos] = rope_ref(kh, pos, t[a["inv_freq"]])
    t[a["v_cache"]][bidx, :, pos] = vh


QKV_ROPE = OpKind(
    "qkv_rope", qkv_rope_prologue, qkv_rope_body,
    ("x", "nw", "w", "inv_freq", "seq_lens", "qn", "kn", "xn", "q", "k_cache", "v_cache"),
    ("B", "D", "HQ", "HKV", "HD", "S", "P", "U", "BLOCK_B", "BLOCK_K", "EPS", "QK_NORM", "MMA", "STAGES", "PRENORM"), 1,
    qkv_rope_reference)


def qkv_pairs(n_heads_total: int, head_dim: int, qk_norm: bool, min_tiles: int) -> int:
    """P, rotation pairs per unit, for tiles of one unit each: hd/2 with QK_NORM (whole head); else the largest P
    (power of two, 2P >= 16) whose tile count n_heads_total * hd / (2P) reaches min_tiles."""
    if qk_norm:
        return head_dim // 2
    ch = 1
    while n_heads_total * ch < min_tiles and head_dim // (2 * ch) >= 16:
        ch *= 2
    return head_dim // (2 * ch)


# The most register rows of a qkv_tiles tile: 512 spilled 184-484 bytes at batch 1-16 (sm_90a, Llama-3.1-8B and -70B
# on 20 SMs), 256 none (Llama-3.2-1B and -3B on 20 SMs, Llama-3.1-70B on 78; scripts/mma_compile_check.py).
QKV_MAX_ROWS = 256


def qkv_tiles(n_heads_total: int, head_dim: int, qk_norm: bool, tiling: Tiling, mma: bool) -> tuple[int, int]:
    """(P, U): rotation pairs per unit and units per tile (module doc). U = 1 (``qkv_pairs``' tiles) except on the
    separate kernels' tensor-core path without QK_NORM: there one wave of at most ``tiling.n_sm`` tiles whose
    live rows U * 2P are the fewest (ties: the larger P), so that no SM streams more weight rows than it must.
    Llama-3.1-8B on 132 SMs: P 8, U 3, 128 tiles of 48 rows (``qkv_pairs``: 96 tiles of 64 rows, 36 SMs idle);
    Llama-3.2-1B: P 4, U 3, 128 tiles of 24 rows (96 of 32). The tile's register arrays hold
    2 next_pow2(U) P rows, from 16 (the MMA's minimum) to QKV_MAX_ROWS; where no single wave fits that (few SMs:
    Llama-3.1-8B on 20), ``qkv_pairs``' tiles, U = 1."""
    pairs = qkv_pairs(n_heads_total, head_dim, qk_norm, tiling.gemv_min_tiles(mma))
    if qk_norm or not (mma and tiling.separate):
        return pairs, 1
    best = None
    p = 4
    while p <= head_dim // 2:
        u = cdiv(n_heads_total * head_dim // (2 * p), tiling.n_sm)
        if MMA_MIN <= 2 * pow2_ceil(u) * p <= QKV_MAX_ROWS and (best is None or u * 2 * p <= best[1] * 2 * best[0]):
            best = (p, u)
        p *= 2
    return best or (pairs, 1)


def add_qkv_rope(graph: Graph, name: str, x: Buffer, nw: Buffer, w: Buffer, inv_freq: Buffer, seq_lens: Buffer,
                 k_cache: Buffer, v_cache: Buffer, *, eps: float, qn: Buffer | None = None,
                 kn: Buffer | None = None, tiling: Tiling = Tiling(), gemv: str = "fma",
                 blocks: dict | None = None) -> Buffer:
    """Append a qkv_rope op (module doc) and return ``q`` (``{name}.q``, [B, Hq, hd]); K and V are written
    into ``k_cache``/``v_cache`` [B, Hkv, S, hd]. The head counts come from the shapes: Hkv and hd from the
    cache, Hq = rows(w) / hd - 2 Hkv. qn/kn (Qwen3's per-head q/k RMSNorm weights [hd]) turn QK_NORM on.
    gemv: "fma" | "mma" (CUDA cores or tensor cores, ops/tiling.py ``check_gemv``; the MMA path needs tiles of
    2 next_pow2(U) P >= 16 rows, which ``qkv_tiles`` always gives). blocks: overrides of the tiling (ints P, U,
    BLOCK_K, STAGES, PRENORM; tests and tuning); a P given without U means U = 1 (one unit per tile, as before units
    existed). PRENORM (module doc) defaults to on for the separate kernels' tensor-core path (Tiling "cover", gemv
    "mma") where the tiles fit one wave (at most ``tiling.n_sm``), with ``tiling.prenorm_pipeline``'s depth and chunks
    for ``tiling.smem``; it adds the graph's scratch ``tiling.prenorm_scratch``. Raises ValueError for shapes that do
    not fit together, an unknown gemv path, P / U overrides the tiles cannot take, or PRENORM without gemv "mma"."""
    B, D = x.shape
    _, HKV, S, HD = k_cache.shape
    NH = w.shape[0] // HD
    HQ = NH - 2 * HKV
    qk_norm = qn is not None
    if w.shape != (NH * HD, D) or HQ < 1 or v_cache.shape != k_cache.shape or (qk_norm and kn is None):
        raise ValueError(f"{name}: x {x.shape}, w {w.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape} do "
                         f"not fit [B, D], [(Hq + 2 Hkv) hd, D], [B, Hkv, S, hd] (qn and kn come together)")
    qn, kn = (qn, kn) if qk_norm else (nw, nw)  # unread without QK_NORM: any model-dtype buffer
    mma = check_gemv(gemv, B)
    blocks = blocks or {}
    P, U = qkv_tiles(NH, HD, qk_norm, tiling, mma) if "P" not in blocks else (blocks["P"], 1)
    U = blocks.get("U", U)
    R = 2 * pow2_ceil(max(U, 1)) * P  # the tile's rows in registers (U * 2P live)
    bad = (f"P={P} and U={U} must be >= 1" if P < 1 or U < 1 else
           f"P={P} must divide hd/2={HD // 2}" if HD % (2 * P) else
           f"with qk_norm a tile is one whole head (P = hd/2 = {HD // 2}, U = 1), not P={P}, U={U}"
           if qk_norm and (2 * P != HD or U != 1) else
           f"gemv='mma' needs tiles of 2 next_pow2(U) P >= {MMA_MIN} rows; P={P}, U={U} give {R}"
           if mma and R < MMA_MIN else None)
    if bad:
        raise ValueError(f"{name}: {bad}")
    sep = mma and tiling.separate  # one wave of tiles (qkv_tiles): chunks of up to twice the elements
    es = x.nbytes // (B * D)
    ch = HD // (2 * P)
    n_tiles = cdiv(NH * ch, U)
    prenorm = bool(blocks.get("PRENORM", prenorm_default(mma, tiling, n_tiles)))
    if prenorm and not mma:
        raise ValueError(f"{name}: PRENORM needs gemv='mma'")
    stages, bk = (prenorm_pipeline(R, es, D, tiling, n_tiles) if prenorm else
                  (mma_stages("qkv_rope", R, mma), block_k_for(D, R, MAX_TILE_ELEMS * (2 if sep else 1), mma=mma)))
    p = {"B": B, "D": D, "HQ": HQ, "HKV": HKV, "HD": HD, "S": S, "P": P, "U": U,
         "BLOCK_B": MMA_COLS if mma else batch_block(B), "BLOCK_K": bk, "EPS": float(eps),
         "QK_NORM": qk_norm, "MMA": mma, "STAGES": stages, **blocks, "PRENORM": prenorm}
    q = graph.add_buffer(f"{name}.q", (B, HQ, HD), x.dtype, "activation")
    xn = prenorm_scratch(graph, n_tiles, B, D, x.dtype) if prenorm else x  # x: unread without PRENORM
    tasks = []
    for t in range(n_tiles):
        reads, writes = [region(x), region(nw), region(seq_lens)], []
        if prenorm:  # the tile's own row of the scratch: written, then read by its chunk loop
            reads.append(region(xn, (0, B), (t, t + 1), (0, D)))
            writes.append(region(xn, (0, B), (t, t + 1), (0, D)))
        if qk_norm:  # the body loads both norm weights for every row (tl.where(is_q, qn, kn)), v heads too
            reads += [region(qn), region(kn)]
        units = range(t * U, min(NH * ch, t * U + U))
        if len(units) < pow2_ceil(U):  # dead slots (_qkv_rows: clamped to unit 0) still load inv_freq[0:P]
            reads.append(region(inv_freq, (0, P)))
        for h, c in (divmod(u, ch) for u in units):
            halves = [(c * P, c * P + P), (HD // 2 + c * P, HD // 2 + c * P + P)]
            reads.append(region(inv_freq, (c * P, c * P + P)))
            reads += [region(w, (h * HD + lo, h * HD + hi), (0, D)) for lo, hi in halves]
            if h < HQ:
                writes += [region(q, (0, B), (h, h + 1), hv) for hv in halves]
            else:
                cache, hh = (k_cache, h - HQ) if h < HQ + HKV else (v_cache, h - HQ - HKV)
                writes += [region(cache, (0, B), (hh, hh + 1), (0, S), hv) for hv in halves]
        n = 2 * P * len(units)  # live rows
        # weights, x, norm weights, outputs, seq_lens, inv_freq (fp32, one per rotation pair: n / 2)
        nbytes = n * D * es + B * D * es + D * es + B * n * es + B * 4 + (n // 2) * 4
        nbytes += 2 * B * D * es if p["PRENORM"] else 0  # its scratch row written and read (L2)
        tasks.append(Task(-1, t, tuple(reads), tuple(writes), nbytes, 2 * B * n * D + 12 * B * n))
    args = {"x": x, "nw": nw, "w": w, "inv_freq": inv_freq, "seq_lens": seq_lens, "qn": qn, "kn": kn, "xn": xn, "q": q,
            "k_cache": k_cache, "v_cache": v_cache}
    graph.add_op(Op(name, QKV_ROPE, {role: b.name for role, b in args.items()}, p), tasks)
    return q
