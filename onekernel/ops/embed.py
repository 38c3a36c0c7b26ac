"""``embed``: token-embedding gather into the residual stream.

``out[b, d] = table[tokens[b], d]`` for tokens int32 [B], table (tok_embeddings) [V, D] model dtype, out
``x.0`` [B, D] (HF ``nn.Embedding``: an exact copy). Tile = BLOCK_D columns for all B rows. Tokens are an
"input" buffer, but a device kernel may write them right before the step (the generation loop copies
next_tokens into them), so they are read in the body, after the wait, like an activation. A token outside
[0, V) writes zeros (never reads out of bounds).
"""
from __future__ import annotations

import triton
import triton.language as tl

from onekernel.graph.ir import Buffer, Graph, Op
from onekernel.ops.base import OpKind
from onekernel.ops.tiling import pow2_ceil, region, row_tiled_tasks


@triton.jit
def embed_prologue(tile, tokens, table, out, B: tl.constexpr, V: tl.constexpr, D: tl.constexpr,
                   BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr):
    return tile * BLOCK_D + tl.arange(0, BLOCK_D)


@triton.jit
def embed_body(tile, cols, tokens, table, out, B: tl.constexpr, V: tl.constexpr, D: tl.constexpr,
               BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr):
    ob = tl.arange(0, BLOCK_B)
    tok = tl.load(tokens + ob, mask=ob < B, other=0, cache_modifier=".cg")
    ok = (tok >= 0) & (tok < V)
    cm = cols[None, :] < D
    v = tl.load(table + tok.to(tl.int64)[:, None] * D + cols[None, :], mask=ok[:, None] & cm, other=0.0)
    tl.store(out + ob[:, None] * D + cols[None, :], v.to(out.dtype.element_ty), mask=(ob < B)[:, None] & cm)


def embed_reference(op: Op, t: dict) -> None:
    a = op.args
    t[a["out"]].copy_(t[a["table"]][t[a["tokens"]].long()])


EMBED = OpKind("embed", embed_prologue, embed_body, ("tokens", "table", "out"),
               ("B", "V", "D", "BLOCK_B", "BLOCK_D"), 1, embed_reference)


def add_embed(graph: Graph, name: str, tokens: Buffer, table: Buffer, block_d: int | None = None) -> Buffer:
    """Append ``out[B, D] = table[tokens]`` tiled over D (BLOCK_D <= 256 columns unless block_d); returns
    ``out`` (``{name}.out``, the table's dtype)."""
    B, = tokens.shape
    V, D = table.shape
    out = graph.add_buffer(f"{name}.out", (B, D), table.dtype, "activation")
    es = out.nbytes // (B * D)
    p = {"B": B, "V": V, "D": D, "BLOCK_B": pow2_ceil(B), "BLOCK_D": block_d or min(pow2_ceil(D), 256)}

    def make(t, d0, d1):
        return ([region(tokens), region(table, (0, V), (d0, d1))], [region(out, (0, B), (d0, d1))],
                2 * B * (d1 - d0) * es + 4 * B, 0)

    graph.add_op(Op(name, EMBED, {"tokens": tokens.name, "table": table.name, "out": out.name}, p),
                 row_tiled_tasks(D, p["BLOCK_D"], make))
    return out
