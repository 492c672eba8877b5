"""The bit layouts shared by the host code and the kernels (plain ints, no Triton).

Two compile-time bitfields go to every kernel:

``OPS``: what the operands hold.

``MB`` (mask bits): the mask as up to :data:`MAX_CLAUSES` OR-ed clauses, each a
conjunction of fields; clause ``c`` owns the :data:`CLAUSE_WIDTH` bits at
``CLAUSE_WIDTH * c``. Per batch element (the call's first batch dim, ``b0``) the
clauses' per-batch data lie in one int32 record of the packed mask tensor, clause
after clause and, inside a clause, field after field in the order of their bits
(widths: KRANGE and QRANGE 2, RRANGE 2·L, KKEEP S, DOC and DOC_NE L + S). The
record layout is written twice, and only twice: in
:func:`attnkit.backends.triton.maskargs.pack_mask` on the host and in ``kmask._fields``
in the kernels.
"""

from __future__ import annotations

__all__ = ["CLAUSE_WIDTH", "MAX_CLAUSES", "NC_SHIFT"]

# -- OPS: operand flags -------------------------------------------------------------
ADDITIVE = 1
"""The Additive score: Q/K hold the projections qa/ka, W holds w_v."""
HAS_KB = 2
"""KB holds a per-key logit bias (B, Hk, S) float32, natural units, pre-scaled."""
HAS_VBAD = 4
"""VBAD flags value rows that were not finite (zeroed by the host)."""
IEEE = 8
"""float32 operands: full-precision products (no TF32), like torch's own matmul."""
EMULATE_BF16 = 16
"""Triton's interpreter: bfloat16 products on float32 copies of the operands, and
every cast to bfloat16 rounded to nearest even (the interpreter truncates)."""
HAS_DO = 32
"""Backward: a gradient of the output was given (else only the weights' one)."""
HAS_DW = 64
"""Backward: a gradient of the returned weights was given."""
MEAN = 128
"""Weights kernel: the average over heads."""

# -- MB: mask bits -------------------------------------------------------------------
MAX_CLAUSES = 2
CLAUSE_WIDTH = 10

LO = 1
"""Band, lower side: key j kept for query i iff j >= i + LO (a kernel argument)."""
HI = 2
"""Band, upper side: j <= i + HI."""
KRANGE = 4
"""Key range: klo[b0] <= j < khi[b0]. Record: [klo, khi]."""
QRANGE = 8
"""Query range: qlo[b0] <= i < qhi[b0]; other rows are padding. Record: [qlo, qhi]."""
RRANGE = 16
"""Per-query key range: rlo[b0, i] <= j < rhi[b0, i]. Record: rlo (L), rhi (L)."""
KKEEP = 32
"""Key keep: kk[b0, j] != 0. Record: kk (S)."""
DOC = 64
"""Documents: qid[b0, i] == kid[b0, j] and qid >= 0. Record: qid (L), kid (S)."""
DOC_NE = 128
"""Not the same document: qid != kid or qid < 0. Record: qid (L), kid (S)."""
DENSE = 256
"""The clause includes the dense keep tensor KEEP (one per call)."""

NC_SHIFT = 20
"""Bits 20-21: the number of clauses (1 or 2)."""
KEEP_SHIFT = 22
"""Bits 22-25: the dense keep's real dims (B, H, L, S: 1, 2, 4, 8); 0 = no dense keep."""
BIAS_SHIFT = 26
"""Bit 26: a dense bias; bits 27-30 its real dims like the keep's."""
RECORD_B1 = 1 << 31
"""Every per-batch tensor has one row shared by the whole batch (record stride 0)."""

DIM_B, DIM_H, DIM_L, DIM_S = 1, 2, 4, 8
