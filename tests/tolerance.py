"""The suite's one rule for comparing floating-point results against a peer.

A float32 result computed two ways (attnkit and eager transformers, attnkit and
torch's layer, a kernel picked by one CPU and another) differs by rounding that
scales with the tensor's magnitude, not with each element's: a gradient element
of 2e-5 next to elements of 1.0 carries an error of about 1e-7 · 1.0, which an
element-wise ``rtol`` on the small element rejects. So results are compared
relative to the tensor's own scale (its largest finite magnitude):

    max |got - want| <= rel * max(|want|)         over the finite entries

with NaN and ±inf required at the same places. ``rel`` defaults to the float32
figure below; a test that needs another figure passes one of the named ones here,
never a number of its own:

- ``FLOAT64_REL``: float64 on both sides; ``FLOAT64_MODEL_REL``: through a whole
  model's forward and backward; ``FLOAT32_STORED_REL``: float64 math through one
  float32 value per term.
- ``FLOAT32_CHAIN_REL``, ``FLOAT32_GRAD_REL``, ``FLOAT32_ULPS_REL``,
  ``FLOAT32_CALL_REL``: float32 results a known, small number of roundings from
  their peer, held tighter than ``FLOAT32_REL``; ``FLOAT32_TILED_GRAD_REL``: a
  gradient from a tiled kernel.
- ``FLOAT16_REL``, ``BFLOAT16_REL`` (``half_rel`` picks one by dtype): a result
  rounded to a half dtype; ``half_grad_rel``: a gradient computed in one.
- ``BYTE_STEP``, ``SIGNED_BYTE_STEP``, ``half_step_rel``, ``byte_sum_rel``: values
  that travel as one byte each.
- ``exp_rel``: a float32 exp whose argument is itself rounded.
- ``BENCH_SIDES_ABS``: the bench's reported difference between its two sides.
- ``FLOAT64_RANKS_REL``: float64 split across context-parallel ranks.
- ``ONE_HOT_REL``: gradients at one-hot rows of huge logits, whose exact value is 0.
- ``PLAIN_RATIO`` and ``PLAIN_FLOOR_REL``: a backend held to a multiple of plain
  same-dtype math's own error, as the conformance campaign holds it.
- ``ZERO_GRAD_REL``: a threshold below which a gradient is zero up to rounding.
- ``WEIGHTS_SCALE``: statistics of attention weights, measured against the
  weights' scale rather than their own.
- ``printed_rel``: a figure printed to a number of significant digits.
- ``plain_math_rel``: a half-precision call held to twice the error of the plain
  same-dtype math a user would write.

Where each entry is computed on its own and entries span orders of magnitude (an
exp per entry, a logsumexp per row), the rule is applied per entry instead
(``assert_close_elementwise``): every entry within ``rel`` of itself.

``QUADRATURE_REL`` is no rounding figure either: a quadrature's error against the
integral it approximates (integrated gradients' completeness).

``TIMING_SPREAD_REL`` is no rounding figure: a benchmark's median of ratios against
the ratio of its medians, which differ by the spread of wall-clock timings.

``GRADCHECK_ATOL`` is the bound handed to ``torch.autograd.gradcheck`` and
``gradgradcheck``, whose comparison is theirs, not this module's.

Exact comparisons (``torch.equal``, ``assert_close(..., rtol=0, atol=0)``) are no
tolerance and stay as they are. tests/unit/test_tolerance_rule.py fails, outside the
documented exceptions (``EXCEPTIONS``, each with its reason here), on a tolerance
keyword (``atol=``, ``rtol=``, ``rel=``, ``abs=``, ``rel_tol=``, ``abs_tol=``) whose
value holds a number, on an ``assert`` whose ``<`` or ``<=`` bound holds a float below
0.1 (a tolerance written as a comparison), and on ``assert_close``, ``assert_allclose``, ``allclose`` or
``isclose`` called without a tolerance: their defaults are element-wise (torch's for
float32 is an ``atol`` of 1e-5 on every entry), so a call says it is exact
(``rtol=0, atol=0``) or compares here. It also fails on a module-level name assigned a
float below 0.01 (a figure kept beside the tests).

One exception, ``EXCEPTIONS``: tests/fuzz_calls.py keeps its per-dtype tables
(``FORWARD_TOL``, ``GRAD_TOL``, ``REPLAY_TOL``). They are the campaign's triage, not a
verdict: a result beyond them is a miss, and each miss is then judged by
``PLAIN_RATIO`` against the plain same-dtype math of the same call and by a float64
replay on the same backend, so the tables only decide which results get that closer
look.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "BENCH_SIDES_ABS",
    "BFLOAT16_REL",
    "BYTE_STEP",
    "EXCEPTIONS",
    "FLOAT16_REL",
    "FLOAT32_CALL_REL",
    "FLOAT32_CHAIN_REL",
    "FLOAT32_GRAD_REL",
    "FLOAT32_REL",
    "FLOAT32_STORED_REL",
    "FLOAT32_TILED_GRAD_REL",
    "FLOAT32_ULPS_REL",
    "FLOAT64_MODEL_REL",
    "FLOAT64_RANKS_REL",
    "FLOAT64_REL",
    "GRADCHECK_ATOL",
    "ONE_HOT_REL",
    "PLAIN_FLOOR_REL",
    "PLAIN_RATIO",
    "QUADRATURE_REL",
    "SIGNED_BYTE_STEP",
    "TIMING_SPREAD_REL",
    "WEIGHTS_SCALE",
    "ZERO_GRAD_REL",
    "assert_close_elementwise",
    "assert_close_to_scale",
    "byte_sum_rel",
    "exp_rel",
    "half_grad_rel",
    "half_rel",
    "half_step_rel",
    "plain_math_rel",
    "printed_rel",
    "scaled_error",
]

FLOAT32_REL = 1e-4
"""Relative to the tensor's scale: room for float32 rounding through a few layers
(about 1e-7 per operation, summed over reductions of a few thousand terms)."""

FLOAT32_CHAIN_REL = 1e-5
"""A short chain of float32 products of probability matrices against float64 math
or an eager peer: attention rollout through a few layers, a small model's weights
read back through two layers. Measured below 2e-6 of the scale."""

FLOAT32_GRAD_REL = 2e-6
"""One float32 backward pass of one attention call against float64 math: the
forward's rounding plus the row sums of dO·O and the products dP·P. Measured
below 4e-7 of the scale."""

FLOAT32_ULPS_REL = 1e-6
"""About 8 float32 ulps (eps is 1.19e-7): a result a few roundings from its peer,
such as an exp per entry, a row sum of weights against 1, a mean of a few terms,
the same weights recomputed by a second float32 path."""

FLOAT32_CALL_REL = 5e-7
"""About 4 float32 ulps of the scale: one float32 attention call against float64
math, or against the same call traced and compiled (logits, one exp and two
reductions of at most a few hundred terms). Measured below 1.7e-7."""

FLOAT32_TILED_GRAD_REL = 2e-5
"""A float32 gradient from a tiled kernel (the Triton kernels under the interpreter)
against float64 math, relative to ``max(scale, 1)``: the weights are recomputed from the
stored lse tile by tile and the key and value gradients are summed over query tiles, so
each entry carries a few more roundings than one backward pass (``FLOAT32_GRAD_REL``).
The floor of 1 keeps gradients that vanish next to their inputs from being held to
their own rounding."""

FLOAT64_REL = 1e-13
"""float64 on both sides: about 450 ulps (eps is 2.2e-16) of the scale, room for
the softmax and reductions of a few hundred terms; measured below 4e-15."""

FLOAT64_MODEL_REL = 1e-10
"""float64 through a small model's forward and backward against a second float64 path
(eager attentions and autograd, step by step): thousands of roundings of sums and
products whose terms cancel in the gradients, well above ``FLOAT64_REL`` and still
orders of magnitude below any float32 result."""

FLOAT32_STORED_REL = 1e-7
"""A float64 computation that passes through one float32 value per term: captum keeps
its integration points and weights in float32 (relative rounding 6e-8)."""

FLOAT64_RANKS_REL = 1e-8
"""float64 on both sides, where one side is split across context-parallel ranks: each
rank's partial softmax is merged through its lse, and the ring's order of merging
differs from one process's reduction, with logits drawn over many orders of magnitude
by the campaign (tests/fuzz_cp.py)."""

ONE_HOT_REL = 1e-5
"""Logits of about 1e5 whose rows are one-hot (each softmax a single 1, so the exact
gradients of q and k are 0): gradients within this share of the call's largest gradient
(that of v). A fused backward's ``exp(s - lse) * (dP - rowsum(dO * O))`` rounds at
``|dO| |v| * eps`` times the scale on the way to q and k."""

ZERO_GRAD_REL = 1e-6
"""Not a tolerance but a threshold: a gradient below this fraction of a model's largest
is zero up to rounding (a key bias: softmax ignores a constant added to a query's
logits), so it is checked against the model's scale, its own being noise."""

PLAIN_RATIO = 4.0
"""How many times plain same-dtype math's error (the reference backend's, in the call's
dtype, against float64) a backend's error may be: the conformance campaign's yardstick
(tests/fuzz_calls.py), also used by tests that hold a backend to it directly."""

PLAIN_FLOOR_REL = 2e-7
"""With ``PLAIN_RATIO``: an error below this share of a result's scale (a few float32
roundings) always passes, where plain math happens to round exactly."""

FLOAT16_REL = 2.0**-10
"""One float16 ulp of the scale (float16 keeps 10 fraction bits): a result rounded
once to float16 is within half of it, the other half is for float32 accumulation
of float16 inputs."""

BFLOAT16_REL = 2.0**-8
"""One bfloat16 ulp of the scale (bfloat16 keeps 7 fraction bits, one ulp of the
leading binade is 2^-7 of a value in [1, 2), so 2^-8 of the scale is at most one
half-ulp rounding plus float32 accumulation): a result rounded once to bfloat16."""

BYTE_STEP = 1 / 255
"""One step of a weight that travels as one byte (0..255) against the largest weight
of its set: decoded, a weight is within half a step of it."""

SIGNED_BYTE_STEP = 1 / 127
"""One step of a signed value that travels as one byte (-127..127) against the largest
magnitude of its set (a page's relevance rows, its A - B differences): decoded, a value
is within half a step of it."""

WEIGHTS_SCALE = 1.0
"""The scale of attention weights (they lie in [0, 1]): statistics computed from them
(entropy, mean distance, the weight on the first key) carry an error on this scale,
whatever their own magnitude; pass it as ``assert_close_to_scale(..., scale=)``."""

QUADRATURE_REL = 0.01
"""Not rounding: integrated gradients' completeness (the scores sum to y(x) - y(baseline))
holds exactly only for the path integral; a quadrature of 64 Gauss-Legendre points
leaves an error of the integrand's curvature, which the method's definition bounds at 1%
of the gap (the figure captum's and the paper's users check)."""

BENCH_SIDES_ABS = 1e-4
"""An absolute figure: ``attnkit bench`` reports each case's largest absolute difference
between its two float32 sides (BENCHMARKS.md's "max abs diff" column), on inputs it
draws at unit scale, so its outputs are of scale about 1 and this is ``FLOAT32_REL`` of
that scale. Its tests check that reported figure; no tensor reaches them."""

GRADCHECK_ATOL = 1e-6
"""The absolute bound ``torch.autograd.gradcheck``/``gradgradcheck`` apply between
float64 analytic and central-difference Jacobians (their eps 1e-6: truncation about
eps² and rounding about 1e-16/eps = 1e-10, times the curvature of the softmax)."""

TIMING_SPREAD_REL = 0.5
"""Not rounding: a benchmark figure that is the median of per-run ratios, against the
ratio of the medians of the same runs. The two agree only up to the run-to-run spread
of wall-clock timings of fresh processes, which on a shared machine reaches tens of
percent; the check is that the figure is that ratio, not a different quantity."""

EXCEPTIONS: dict[str, tuple[int, str]] = {
    "tests/fuzz_calls.py": (
        3,
        "the conformance campaign's triage: a result beyond its dtype's figure is no verdict "
        "but a miss, which is then judged against plain same-dtype math and a float64 replay",
    ),
}
"""Test files allowed a bare ``atol=``/``rtol=`` literal: path -> (how many, why)."""


def half_rel(dtype: torch.dtype) -> float:
    """``FLOAT16_REL`` or ``BFLOAT16_REL`` for a result of ``dtype``; ``FLOAT32_REL`` else."""
    return {torch.float16: FLOAT16_REL, torch.bfloat16: BFLOAT16_REL}.get(dtype, FLOAT32_REL)


def half_rounded_weights_rel(dtype: torch.dtype) -> float:
    """A result in a half dtype against float64 math on the rounded inputs, when a learned
    score's weights were rounded to that dtype as well (autocast uses them there): two
    roundings, the weights' and the output's."""
    return 2 * half_rel(dtype)


def half_parts_grad_rel(dtype: torch.dtype, parts: int) -> float:
    """A gradient in a half dtype summed from ``parts`` pieces (a ring's key blocks), each
    rounded to that dtype, against one call's: the forward's rounding and one per part."""
    return (parts + 1) * half_rel(dtype)


def half_grad_rel(dtype: torch.dtype) -> float:
    """A gradient through one attention call in ``dtype`` against float64 math: in a half
    dtype, the forward's rounding to it (one ``half_rel``) carried through the backward
    plus the gradient's own rounding to it (another); ``FLOAT32_GRAD_REL`` in float32."""
    if dtype in (torch.float16, torch.bfloat16):
        return 2 * half_rel(dtype)
    return FLOAT32_GRAD_REL


def printed_rel(digits: int) -> float:
    """Relative to each entry: a float32 figure printed to ``digits`` significant digits
    (a page's CSV) is within half a unit of its last digit, 0.5 · 10^(1 - digits) of
    itself, plus ``FLOAT32_ULPS_REL`` for the float32 figure that was printed."""
    return 0.5 * 10.0 ** (1 - digits) + FLOAT32_ULPS_REL


def half_step_rel(step: float) -> float:
    """Relative to the largest magnitude of a set: a value quantized in steps of ``step``
    of it (``BYTE_STEP``, ``SIGNED_BYTE_STEP``) is within half a step once decoded, plus
    ``FLOAT32_ULPS_REL`` for the float32 scale it is decoded with."""
    return step / 2 + FLOAT32_ULPS_REL


def byte_sum_rel(terms: int) -> float:
    """Relative to the largest weight: a sum of ``terms`` byte weights, each within half
    a ``BYTE_STEP`` of its own, is within ``terms`` half steps of the exact sum."""
    return terms * BYTE_STEP / 2


def exp_rel(arg_max: float) -> float:
    """Relative to each entry: the float32 exp of a difference ``x = s - shift`` formed in
    float32. The difference rounds by up to ``|x|`` · 2^-24, which the exp turns into
    that relative error, on top of the exp's own ``FLOAT32_ULPS_REL``."""
    return FLOAT32_ULPS_REL + arg_max * 2.0**-24


def plain_math_rel(plain: torch.Tensor, want: torch.Tensor) -> float:
    """For a half-precision call against the float64 oracle ``want``: twice the scaled
    error of ``plain``, the same-dtype math a user writes (its rounding is the yardstick
    for what the dtype allows), never tighter than ``FLOAT32_ULPS_REL``."""
    return max(2 * scaled_error(torch.as_tensor(plain), torch.as_tensor(want)), FLOAT32_ULPS_REL)


def scaled_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over the entries finite in ``want``, divided by max |want| there
    (1 when every finite entry of ``want`` is 0); computed in float64."""
    g = got.detach().to(torch.float64).cpu()
    w = want.detach().to(torch.float64).cpu()
    fin = torch.isfinite(w)
    if not bool(fin.any()):
        return 0.0
    scale = float(w[fin].abs().max())
    err = float((g[fin] - w[fin]).abs().max())
    return err / (scale if scale > 0 else 1.0)


def _as_tensors(got: object, want: object, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.as_tensor(got).detach().to(torch.float64).cpu()
    w = torch.as_tensor(want).detach().to(torch.float64).cpu()
    assert g.shape == w.shape, f"{what}: shape {tuple(g.shape)} != {tuple(w.shape)}"
    assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: NaN at different places"
    assert torch.equal(torch.isinf(g), torch.isinf(w)), f"{what}: inf at different places"
    assert torch.equal(g[torch.isinf(g)], w[torch.isinf(w)]), f"{what}: inf of different signs"
    return g, w


def _tiny(x: object) -> float:
    """The smallest normal number of ``x``'s float dtype (tensor or array), else 0."""
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0
    try:
        return float(np.finfo(dtype).tiny)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def assert_close_to_scale(
    got: torch.Tensor,
    want: torch.Tensor,
    *,
    rel: float = FLOAT32_REL,
    scale: float | None = None,
    what: str = "result",
) -> None:
    """Assert ``got`` equals ``want`` to ``rel`` of ``want``'s largest finite magnitude.

    Shapes must match, NaN and ±inf must sit at the same places, and the finite
    entries may differ by at most ``rel * max |want|``.

    Args:
        got, want: tensors (or arrays) of the same shape, any float dtype, any device.
        rel: allowed error relative to the scale of ``want``.
        scale: the scale the error is measured against, where it is not ``want``'s own
            magnitude (statistics of weights: their error scales with the weights).
        what: names the quantity in the failure message.
    """
    g, w = _as_tensors(got, want, what)
    if scale is None:
        err = scaled_error(g, w)
    else:
        fin = torch.isfinite(w)
        err = float((g[fin] - w[fin]).abs().max()) / scale if bool(fin.any()) else 0.0
    assert err <= rel, f"{what}: error {err:.3g} of its scale > allowed {rel:.3g}"


def assert_close_elementwise(
    got: torch.Tensor,
    want: torch.Tensor,
    *,
    rel: float,
    what: str = "result",
) -> None:
    """Assert every finite entry of ``got`` is within ``rel`` of the same entry of ``want``.

    For results whose entries are each computed on their own and span orders of
    magnitude (an exp per entry, a logsumexp per row), where an entry's error scales
    with the entry. Entries of ``want`` at the bottom of ``got``'s dtype carry no
    relative precision there: subnormals, and results that vectorized exp kernels
    flush to 0 a hair above the smallest normal number (their cutoff sits at about
    ln of it). So the error of each entry may also reach twice the smallest normal
    number of ``got``'s dtype. NaN and ±inf must sit at the same places.
    """
    tiny = 2 * _tiny(got)
    g, w = _as_tensors(got, want, what)
    fin = torch.isfinite(w)
    if not bool(fin.any()):
        return
    err = (g[fin] - w[fin]).abs()
    allowed = (rel * w[fin].abs()).clamp(min=tiny)
    worst = int((err - allowed).argmax())
    assert bool((err <= allowed).all()), (
        f"{what}: error {float(err[worst]):.3g} at an entry of {float(w[fin][worst]):.3g}"
        f" > allowed {rel:.3g} of it"
    )
