"""Clear errors for the core's bad inputs (each fails with a message, before any compute)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks, scores

from tolerance import FLOAT32_REL, FLOAT64_REL, assert_close_to_scale


def test_gaussian_with_a_non_number_sigma_names_the_argument() -> None:
    with pytest.raises(TypeError, match=r"Gaussian: sigma must be a positive finite number"):
        scores.Gaussian("wide")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, float("inf"), float("nan")])
def test_a_learnt_gaussian_sigma_at_zero_or_not_finite_is_refused(bad: float) -> None:
    """Training or load_state_dict can set a learnable σ the constructor refuses: each
    call refuses it by name (repeated calls too), where the logits would be NaN; a
    negative σ is a bandwidth of |σ|."""
    score = scores.Gaussian(1.5, learnable=True).double()
    q = torch.randn(1, 3, 4, dtype=torch.float64)
    for _ in range(2):
        attnkit.attention(q, q, q, score=score)
    want = attnkit.attention(q, q, q, score=score)
    with torch.no_grad():
        score.sigma.fill_(bad)
    with pytest.raises(ValueError, match=r"^score: Gaussian sigma must be a nonzero finite"):
        attnkit.attention(q, q, q, score=score)
    with torch.no_grad():
        score.sigma.fill_(-1.5)
    assert_close_to_scale(attnkit.attention(q, q, q, score=score), want, rel=FLOAT64_REL)


@pytest.mark.parametrize("backend", ["reference", "chunked", "sdpa"])
def test_a_gaussian_sigma_whose_logits_overflow_is_refused(backend: str) -> None:
    """A σ so small that 1/σ² comes near float32's largest value (1e-18; at 4e-20 rows
    read as masked, at 6e-20 a key's gradient was inf), or that every key of a row has
    a logit beyond float32 (1e-17 at distances of order 1e3), is refused by name:
    reference and chunked read such rows as masked (output 0) and sdpa gave NaN.
    float64 takes both; 1e-16 at distances of order 1 runs (each row is one-hot)."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 5, 4, generator=gen), torch.randn(2, 2, 7, 4, generator=gen)
    with pytest.raises(ValueError, match=r"^score: Gaussian sigma 1e-18 is too small for torch"):
        attnkit.attention(q, k, k, score=scores.Gaussian(1e-18), backend=backend)
    far_q, far_k = 1e3 * q, 1e3 * k
    with pytest.raises(ValueError, match=r"^score: Gaussian sigma 1e-17 is too small for these"):
        attnkit.attention(far_q, far_k, far_k, score=scores.Gaussian(1e-17), backend=backend)
    for sigma, a, b in ((1e-18, q, k), (1e-17, far_q, far_k)):
        score = scores.Gaussian(sigma).double()
        out = attnkit.attention(a.double(), b.double(), b.double(), score=score)
        assert torch.isfinite(out).all() and (out != 0).any(-1).all()
    if backend != "sdpa":  # (sdpa refuses the dot form's cancellation there)
        out = attnkit.attention(q, k, k, score=scores.Gaussian(1e-16), backend=backend)
        nearest = torch.cdist(q, k).argmin(-1)  # (2, 2, 5): the one-hot row's key
        want = torch.gather(k, -2, nearest.unsqueeze(-1).expand(-1, -1, -1, 4))
        assert_close_to_scale(out, want, rel=FLOAT64_REL)


@pytest.mark.parametrize("backend", ["reference", "chunked", "sdpa"])
def test_a_small_learnt_gaussian_sigma_has_a_finite_gradient(backend: str) -> None:
    """σ = 1e-10 in float32 over inputs of that scale: 0.5/σ²'s own backward formed
    0.5/σ⁴, beyond float32, and dσ was inf (reference) or NaN; it is 3.2e11."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 3, generator=gen, dtype=torch.float64) for n in (3, 5, 5))
    grads = []
    for dtype in (torch.float64, torch.float32):
        score = scores.Gaussian(1e-10, learnable=True).to(dtype)
        out = attnkit.attention(
            (1e-10 * q).to(dtype), (1e-10 * k).to(dtype), v.to(dtype), score=score,
            backend=backend,
        )  # fmt: skip
        (d_sigma,) = torch.autograd.grad(out.sum(), score.sigma)
        grads.append(d_sigma.double())
    assert torch.isfinite(grads[1])
    assert_close_to_scale(grads[1], grads[0], rel=FLOAT32_REL)


def test_a_kernel_score_checks_its_learnt_sigma() -> None:
    """KernelScore used directly (not through NadarayaWatson) refuses a learnt σ at 0,
    which read every key as outside the support (output 0, silently)."""
    from attnkit.nn import KernelScore

    score = KernelScore("epanechnikov", 2.0, learnable=True)
    q = torch.randn(1, 3, 2)
    attnkit.attention(q, q, q, score=score)
    with torch.no_grad():
        score.sigma.fill_(0.0)
    with pytest.raises(ValueError, match=r"^score: epanechnikov sigma must be a nonzero finite"):
        attnkit.attention(q, q, q, score=score)


@pytest.mark.parametrize("tensor", [torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, 2)])
def test_a_mask_and_a_tensor_says_how_to_wrap_the_tensor(tensor: torch.Tensor) -> None:
    with pytest.raises(TypeError, match=r"masks\.keep\(t\).*masks\.block\(t\)"):
        masks.causal() & tensor  # type: ignore[operator]
    with pytest.raises(TypeError, match="wrap a tensor first"):
        tensor & masks.causal()  # type: ignore[operator]


def test_meta_tensors_build_masks_without_reading_values() -> None:
    bias = masks.bias(torch.empty(4, 4, device="meta"))
    lens = masks.valid_lens(torch.empty(2, dtype=torch.long, device="meta"))
    q = torch.empty(2, 1, 4, 8, device="meta")
    ex = attnkit.explain(q, q, q, mask=bias & lens)
    assert isinstance(ex.reasons, dict)


def test_return_weights_mean_needs_a_head_dim_and_a_flag() -> None:
    q = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r'"mean" averages over the head dim'):
        attnkit.attention(q, q, q, return_weights="mean")
    with pytest.raises(TypeError, match=r'return_weights: expected True, False or "mean"'):
        attnkit.attention(q, q, q, return_weights="heads")  # type: ignore[arg-type]


def test_return_weights_mean_equals_the_mean_of_per_head_weights_on_every_backend() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (5, 7, 7))
    mask = masks.causal("bottom_right")
    _, per_head = attnkit.attention(q, k, v, mask=mask, return_weights=True, backend="reference")
    for name in ("reference", "chunked", "sdpa"):
        _, mean = attnkit.attention(q, k, v, mask=mask, return_weights="mean", backend=name)
        assert mean.shape == (2, 5, 7)
        assert_close_to_scale(mean, per_head.mean(dim=1), rel=FLOAT64_REL)


def test_a_mask_too_complex_to_lower_runs_on_the_reference_backend() -> None:
    """~ of an | multiplies the clauses out: ~ of 11 windows ORed is 2^11 conjunctions, and
    three nested ~ over four small masks ran out of memory (chunked, sdpa and automatic
    dispatch; reference builds masks densely). Past 1,024 conjunctions the symbolic
    backends decline it by name and the reference backend runs it."""
    from attnkit.blockplan.atoms import MaskTooComplex

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 1, n, 3, generator=gen, dtype=torch.float64) for n in (7, 8, 8))
    bands = masks.window(0, 0)
    for i in range(1, 11):
        bands = bands | masks.window(i, i)  # (nested bands: nothing simplifies them)
    mask = ~bands
    with pytest.raises(MaskTooComplex, match=r"^mask: its & \| ~ lower to 2,048 conjunctions"):
        mask.lower(7, 8, torch.device("cpu"))
    assert attnkit.explain(q, k, v, mask=mask).chosen == "reference"
    want = attnkit.attention(q, k, v, mask=masks.keep(mask.to_dense(7, 8)), backend="chunked")
    assert_close_to_scale(attnkit.attention(q, k, v, mask=mask), want, rel=FLOAT64_REL)
    with pytest.raises(attnkit.BackendNotSupportedError, match=r"chunked: .* conjunctions"):
        attnkit.attention(q, k, v, mask=mask, backend="chunked")


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_to_dense_names_a_bad_length(bad: object) -> None:
    """torch's arange and ones spoke of step signs and positional arguments."""
    with pytest.raises(ValueError, match=r"^to_dense: L must be an int >= 0 \(a length\)"):
        masks.causal().to_dense(bad, 5)  # type: ignore[arg-type]


def _edit_bias(mask: masks.Mask) -> None:
    mask.tensor[1, 3] = float("nan")  # type: ignore[attr-defined]


def _edit_lens(mask: masks.Mask) -> None:
    mask.lens[1] = -1  # type: ignore[attr-defined]


def _edit_prefix(mask: masks.Mask) -> None:
    mask.prefix[0] = -2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("make", "edit", "message"),
    [
        (lambda: masks.bias(torch.zeros(5, 7)), _edit_bias, "NaN or \\+inf"),
        (lambda: masks.valid_lens(torch.tensor([7, 3])), _edit_lens, "must be >= 0"),
        (lambda: masks.prefix_lm(torch.tensor([2, 3])), _edit_prefix, "must be >= 0"),
    ],
    ids=["bias", "valid_lens", "prefix_lm"],
)
def test_a_mask_edited_in_place_is_checked_again_at_the_next_call(
    backend: str, make: object, edit: object, message: str
) -> None:
    # the checks made when a mask is made were skipped for a reused one: a NaN row, or
    # a row of zeros for a length of -1, came back silently
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 4, generator=g) for n in (5, 7, 7))
    mask = make()  # type: ignore[operator]
    attnkit.attention(q, k, v, mask=mask, backend=backend)
    edit(mask)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        attnkit.attention(q, k, v, mask=mask, backend=backend)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_copied_bias_reads_its_values_again(how: str) -> None:
    # a copy kept the original's record "read at version N" while its new tensor
    # restarted at that version: a NaN written before the copy came back as NaN output
    import copy
    import io
    import pickle

    t = torch.zeros(4, 4)
    t[:, 3] = float("-inf")  # one write: version 1, the version a copy's tensor starts at
    mask = masks.bias(t)  # read now, at version 1
    t[0, 0] = float("nan")  # after it was read
    if how == "deepcopy":
        copied = copy.deepcopy(mask)
    elif how == "pickle":
        copied = pickle.loads(pickle.dumps(mask))
    else:
        buffer = io.BytesIO()
        torch.save(mask, buffer)
        buffer.seek(0)
        copied = torch.load(buffer, weights_only=False)
    q = torch.randn(1, 1, 4, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        attnkit.attention(q, q, q, mask=copied)
