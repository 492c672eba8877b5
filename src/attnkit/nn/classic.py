"""d2l-style attention layers and Nadaraya–Watson kernel regression.

:class:`AdditiveAttention` and :class:`DotProductAttention` keep d2l's forward
signature ``(queries, keys, values, valid_lens=None)``, its submodule names
(``W_q``, ``W_k``, ``w_v``) and the weights of the last call in
``.attention_weights``. One deliberate difference: d2l masks with -1e6, so a
row whose valid length is 0 gets a uniform average of every value; here such
a row is fully masked and gives 0 (weights 0), like every attnkit layer.

:class:`NadarayaWatson` is kernel regression written as attention: the
weights are a kernel normalized over the keys, which
:func:`attnkit.attention` computes as a softmax of the log-kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import nn

from .. import masks
from .._host import readable
from .._torch_features import check_compiling
from ..functional import attention
from ..scores import Additive, Gaussian, Score, ScoreName, check_bandwidth
from ._common import check_dropout, check_param_dtype, check_positive_int, shape_str

__all__ = ["AdditiveAttention", "DotProductAttention", "KernelScore", "NadarayaWatson"]


def _check_dtypes(owner: str, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
                  ) -> None:  # fmt: skip
    """queries, keys and values of one floating dtype, named by the layer."""
    if not (queries.dtype == keys.dtype == values.dtype):
        raise TypeError(
            f"{owner}: queries, keys and values must share a dtype, got {queries.dtype}, "
            f"{keys.dtype} and {values.dtype}; convert them with .to(dtype)"
        )


def _check_qkv(
    owner: str,
    queries: object,
    keys: object,
    values: object,
    q_features: int | None,
    k_features: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """d2l layout: queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv)."""
    for name, t, layout in (
        ("queries", queries, "(B, L, Dq)"),
        ("keys", keys, "(B, S, Dk)"),
        ("values", values, "(B, S, Dv)"),
    ):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{owner}: {name} must be a floating-point tensor of shape {layout}")
        if t.ndim != 3:
            raise ValueError(f"{owner}: {name} must have shape {layout}, got {shape_str(t)}")
    assert isinstance(queries, torch.Tensor) and isinstance(keys, torch.Tensor)
    assert isinstance(values, torch.Tensor)
    if not (queries.shape[0] == keys.shape[0] == values.shape[0]):
        raise ValueError(
            f"{owner}: queries, keys and values must share the batch size B, got "
            f"{shape_str(queries)}, {shape_str(keys)}, {shape_str(values)}"
        )
    _check_same(
        owner,
        "number of keys S",
        ("keys", keys, keys.shape[1]),
        ("values", values, values.shape[1]),
    )
    if q_features is not None and queries.shape[-1] != q_features:
        raise ValueError(
            f"{owner}: queries have {queries.shape[-1]} features, expected query_size={q_features}"
        )
    if k_features is not None and keys.shape[-1] != k_features:
        raise ValueError(
            f"{owner}: keys have {keys.shape[-1]} features, expected key_size={k_features}"
        )
    if q_features is None and queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"{owner}: queries and keys must have the same feature size for a dot product, got "
            f"{shape_str(queries)} and {shape_str(keys)}"
        )
    return queries, keys, values


_UNSIGNED_WIDE = tuple(
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
)


def _valid_lens_mask(
    owner: str, valid_lens: object, B: int, L: int, S: int
) -> masks.ValidLensMask | None:
    """d2l's ``valid_lens``: (B,) per sequence or (B, L) per query, each in [0, S].

    The values are checked only where reading them costs no device sync (a CPU
    tensor outside ``torch.compile``); shapes and dtypes are always checked.
    """
    if valid_lens is None:
        return None
    if not isinstance(valid_lens, torch.Tensor):
        bad = TypeError(
            f"{owner}: valid_lens must be an integer tensor of shape (B,) or (B, L), got "
            f"{type(valid_lens).__name__}"
        )
        if not isinstance(valid_lens, Sequence) or isinstance(valid_lens, (str, bytes)):
            raise bad
        try:
            valid_lens = torch.as_tensor(valid_lens)
        except (TypeError, ValueError, RuntimeError):
            raise bad from None
    lens = valid_lens
    if lens.dtype == torch.bool or lens.is_complex():
        raise TypeError(f"{owner}: valid_lens must hold integers, got dtype {lens.dtype}")
    host = readable(lens)
    if lens.is_floating_point():
        if host and not bool(torch.equal(lens, lens.round())):
            raise ValueError(f"{owner}: valid_lens must hold whole numbers, got {lens.tolist()}")
        lens = lens.to(torch.long)
    if tuple(lens.shape) not in ((B,), (B, L)):
        raise ValueError(
            f"{owner}: valid_lens must have shape ({B},) or ({B}, {L}), got {shape_str(lens)}"
        )
    if host and lens.numel():
        wide = lens.to(torch.long) if lens.dtype in _UNSIGNED_WIDE else lens  # (no min/max
        lo, hi = int(wide.min()), int(wide.max())  # for uint16/32/64 in torch)
        if lens.dtype == torch.uint64 and bool((wide < 0).any()):
            lo = 2**63  # (past int64: wrapped around by the conversion)
        if lo < 0 or hi > S:
            raise ValueError(
                f"{owner}: valid_lens must lie in [0, {S}] (there are {S} keys), got values "
                f"from {lo} to {hi}"
            )
    return masks.valid_lens(lens.to(torch.long))


def _check_same(
    owner: str, what: str, a: tuple[str, torch.Tensor, int], b: tuple[str, torch.Tensor, int]
) -> None:
    """Raise unless two inputs agree on one size; ``a`` and ``b`` are (name, the input as
    given (any shape, shown in the message), its size of ``what``)."""
    (a_name, a_t, a_size), (b_name, b_t, b_size) = a, b
    if a_size != b_size:
        raise ValueError(
            f"{owner}: {a_name} and {b_name} must have the same {what}, got {a_name} "
            f"{shape_str(a_t)} and {b_name} {shape_str(b_t)}"
        )


class _KeepsWeights(nn.Module):
    """A layer that keeps its last call's weights in ``.attention_weights``."""

    attention_weights: torch.Tensor | None

    def __getstate__(self) -> dict[str, object]:
        """The module's state with the kept weights detached: a copy (``copy.deepcopy``,
        pickle) takes their values, not the graph of the call that made them (which
        ``deepcopy`` refuses)."""
        state = self.__dict__.copy()
        kept = state.get("attention_weights")
        if isinstance(kept, torch.Tensor) and kept.grad_fn is not None:
            state["attention_weights"] = kept.detach()
        return state


class _ValidLensAttention(_KeepsWeights):
    """What d2l's two layers share: ``forward(queries, keys, values, valid_lens)``,
    dropout on the weights, and the weights of the last call in ``.attention_weights``."""

    _owner = "attention"

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(check_dropout(self._owner, dropout))
        self.attention_weights: torch.Tensor | None = None

    def _score_and_sizes(
        self, queries: object, keys: object, values: object
    ) -> tuple[ScoreName | Score, int | None, int | None]:
        """The score, and the query and key feature sizes it needs (None: any, but equal),
        for a call on ``queries`` (B, L, Dq), ``keys`` (B, S, Dk), ``values`` (B, S, Dv)."""
        raise NotImplementedError

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), valid_lens (B,) or (B, L).

        Returns (B, L, Dv); the weights (B, L, S) are kept in ``.attention_weights``.
        """
        check_compiling()
        score, q_size, k_size = self._score_and_sizes(queries, keys, values)
        q, k, v = _check_qkv(self._owner, queries, keys, values, q_size, k_size)
        check_param_dtype(self._owner, self, queries=q)
        _check_dtypes(self._owner, q, k, v)  # (after the parameters, which name the layer's)
        mask = _valid_lens_mask(self._owner, valid_lens, q.shape[0], q.shape[1], k.shape[1])
        p = self.dropout.p if self.training else 0.0
        out, self.attention_weights = attention(
            q, k, v, score=score, mask=mask, dropout_p=p, return_weights=True
        )  # (B, L, Dv), (B, L, S)
        return out


class DotProductAttention(_ValidLensAttention):
    """d2l's scaled dot-product attention: softmax(q kᵀ / sqrt(d)) v.

    Args:
        dropout: dropout on the attention weights while training, in [0, 1).

    ``forward(queries (B, L, d), keys (B, S, d), values (B, S, Dv), valid_lens=None)``
    returns (B, L, Dv) and keeps the weights (B, L, S) in ``.attention_weights``.
    ``valid_lens`` is (B,) or (B, L): key j is kept when j < the length. A
    length of 0 gives output 0 (d2l: a uniform average).
    """

    _owner = "DotProductAttention"

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__(dropout)

    def _score_and_sizes(
        self, queries: object, keys: object, values: object
    ) -> tuple[ScoreName | Score, int | None, int | None]:
        return "scaled_dot", None, None


_ADDITIVE_FORMS = (
    "AdditiveAttention(num_hiddens, dropout=0.0) (input sizes inferred on the first call) or "
    "AdditiveAttention(key_size, query_size, num_hiddens, dropout=0.0)"
)


def _bind_additive_args(args: tuple[object, ...], keywords: dict[str, object]) -> dict[str, object]:
    """Bind the arguments of either :class:`AdditiveAttention` form to their names.

    The lazy form ``(num_hiddens, dropout)`` is chosen when neither ``key_size``
    nor ``query_size`` is given and the arguments fit it; otherwise the sized
    form ``(key_size, query_size, num_hiddens, dropout)``.
    """
    given = {name: v for name, v in keywords.items() if v is not None}

    def bind(names: tuple[str, ...]) -> dict[str, object] | None:
        if len(args) > len(names):
            return None
        bound = dict(zip(names, args, strict=False))
        for name, v in given.items():
            if name in bound or name not in names:
                return None
            bound[name] = v
        return bound

    lazy = None
    if "key_size" not in given and "query_size" not in given:
        lazy = bind(("num_hiddens", "dropout"))
        p = None if lazy is None else lazy.get("dropout")
        if isinstance(p, int) and not isinstance(p, bool) and p >= 1:
            lazy = None  # (2, 20): two sizes, not (num_hiddens, dropout)
    bound = lazy if lazy is not None else bind(("key_size", "query_size", "num_hiddens", "dropout"))
    required = ("num_hiddens",) if lazy is not None else ("key_size", "query_size", "num_hiddens")
    if bound is None or any(name not in bound for name in required):
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in given.items()])
        raise TypeError(f"AdditiveAttention: expected {_ADDITIVE_FORMS}, got ({shown})")
    return bound


class AdditiveAttention(_ValidLensAttention):
    """d2l's additive (Bahdanau) attention: softmax(w_vᵀ tanh(W_q q + W_k k)) v.

    Two constructor forms, as in d2l's editions:

    - ``AdditiveAttention(num_hiddens, dropout=0.0)``: ``W_q`` and ``W_k`` are
      ``nn.LazyLinear`` layers whose input sizes are read from the first call
      (d2l's current form);
    - ``AdditiveAttention(key_size, query_size, num_hiddens, dropout=0.0)``:
      sizes given up front (d2l's earlier form).

    Args:
        key_size: Dk, the feature size of the keys (sized form only).
        query_size: Dq, the feature size of the queries (sized form only).
        num_hiddens: the hidden size of W_q and W_k.
        dropout: dropout on the attention weights while training, in [0, 1).

    Submodules ``W_k`` (Dk -> hidden), ``W_q`` (Dq -> hidden), ``w_v`` (hidden -> 1),
    all bias-free Linear layers, as in d2l: d2l's state_dict loads unchanged.
    ``forward(queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), valid_lens=None)``
    returns (B, L, Dv) and keeps the weights (B, L, S) in ``.attention_weights``.
    """

    _owner = "AdditiveAttention"

    def __init__(
        self,
        *args: float,
        key_size: int | None = None,
        query_size: int | None = None,
        num_hiddens: int | None = None,
        dropout: float | None = None,
    ) -> None:
        bound = _bind_additive_args(
            args,
            {
                "key_size": key_size,
                "query_size": query_size,
                "num_hiddens": num_hiddens,
                "dropout": dropout,
            },
        )
        hidden = check_positive_int(self._owner, "num_hiddens", bound["num_hiddens"])
        lazy = "key_size" not in bound
        if not lazy:
            k_size = check_positive_int(self._owner, "key_size", bound["key_size"])
            q_size = check_positive_int(self._owner, "query_size", bound["query_size"])
        super().__init__(bound.get("dropout", 0.0))  # type: ignore[arg-type]
        # The layer owns the score's Linear modules under d2l's names; the score
        # itself is kept outside the module tree so the state_dict has d2l's keys.
        # The lazy form builds its score with placeholder input sizes: the score
        # property hands it the layer's own (lazy) modules.
        score = Additive(1, 1, hidden) if lazy else Additive(q_size, k_size, hidden)
        self.W_k: nn.Linear = nn.LazyLinear(hidden, bias=False) if lazy else score.W_k
        self.W_q: nn.Linear = nn.LazyLinear(hidden, bias=False) if lazy else score.W_q
        self.w_v = score.w_v
        object.__setattr__(self, "_score", score)

    @property
    def score(self) -> Additive:
        """The :class:`attnkit.scores.Additive` score sharing this layer's W_q, W_k, w_v."""
        score: Additive = self.__dict__["_score"]
        # Keep the score's modules the layer's own, even after the layer's were replaced.
        score.W_q, score.W_k, score.w_v = self.W_q, self.W_k, self.w_v
        return score

    def _infer_sizes(self, queries: object, keys: object, values: object) -> None:
        """Fix the input sizes of the lazy ``W_q``/``W_k`` from the first call.

        A lazy Linear whose weight was loaded from a state_dict keeps that
        weight's size (a mismatching input is then reported by the size check).
        """
        q_size = queries.shape[-1] if isinstance(queries, torch.Tensor) else None
        k_size = keys.shape[-1] if isinstance(keys, torch.Tensor) else None
        q, k, _ = _check_qkv(self._owner, queries, keys, values, q_size, k_size)
        with torch.no_grad():
            for linear, x in ((self.W_q, q), (self.W_k, k)):
                if not _is_lazy(linear):
                    continue
                if linear.has_uninitialized_params():  # type: ignore[operator]
                    # (B, 0, hidden) in the layer's dtype: reads the feature size and
                    # computes nothing; an input of another dtype is named by the check
                    # of the parameters' dtype that follows, not by torch's matmul
                    linear(x[:, :0].to(linear.weight.dtype))
                # A LazyLinear loaded from a state_dict leaves in_features at 0.
                linear.in_features = int(linear.weight.shape[1])

    def _score_and_sizes(
        self, queries: object, keys: object, values: object
    ) -> tuple[ScoreName | Score, int | None, int | None]:
        if _is_lazy(self.W_q) or _is_lazy(self.W_k):  # the lazy form: sizes of the first call
            self._infer_sizes(queries, keys, values)
        return self.score, self.W_q.in_features, self.W_k.in_features


def _is_lazy(module: nn.Module) -> bool:
    """True until a LazyLinear's first call turns it into a plain Linear."""
    return isinstance(module, nn.modules.lazy.LazyModuleMixin)


# --------------------------------------------------------------------------- Nadaraya–Watson


CompactKernel = Literal["boxcar", "epanechnikov"]
"""The kernels of :class:`KernelScore` (Nadaraya–Watson's compactly supported ones)."""


class KernelScore(Score):
    """Log of a compactly supported kernel of ``u = ‖q - k‖ / σ``, as a score.

    Nadaraya–Watson weights are ``K(u_j) / Σ_i K(u_i)``, which is exactly the
    softmax of ``log K(u)``; outside the support ``log K = -inf`` blocks the
    key, so a query with no key in its support gets weights 0 and output 0.
    Constant factors of K cancel in the normalization and are dropped.

    Args:
        kernel: ``"boxcar"``, K(u) = 1 for u <= 1, else 0 (log K = 0 or -inf); or
            ``"epanechnikov"``, K(u) = 1 - u² for u < 1, else 0 (log K = log(1 - u²)).
        sigma: the bandwidth σ, a positive finite float.
        learnable: keyword-only; make σ an ``nn.Parameter`` (the boxcar's gets zero
            gradients: its weights are piecewise constant in σ).

    Raises:
        ValueError: another kernel, or σ that is not a positive finite float.
    """

    dot_reducible = False

    def __init__(
        self, kernel: CompactKernel, sigma: float = 1.0, *, learnable: bool = False
    ) -> None:
        super().__init__()
        if kernel not in get_args(CompactKernel):
            raise ValueError(
                f"KernelScore: kernel must be 'boxcar' or 'epanechnikov', got {kernel!r}"
            )
        if (
            isinstance(sigma, bool)
            or not isinstance(sigma, (int, float))
            or not (math.isfinite(sigma) and sigma > 0)
        ):
            raise ValueError(f"KernelScore: sigma must be a positive finite float, got {sigma!r}")
        self.kernel = kernel
        self.name = kernel
        value = torch.tensor(
            float(sigma), dtype=torch.get_default_dtype() if learnable else torch.float64
        )
        if learnable:
            self.sigma = nn.Parameter(value)
        else:
            self.register_buffer("sigma", value)

    def check_parameters(self, dtype: torch.dtype | None = None) -> None:
        """σ must be nonzero and finite where it is read, and ``1 / σ²`` finite in the
        logits' dtype (a learnt σ at 0 read every key as outside the support: output 0)."""
        check_bandwidth(self.sigma, f"score: {self.kernel}", dtype)

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """log K(‖q - k‖ / σ): q (..., L, E), k (..., S, E) -> (..., L, S); -inf outside."""
        sigma = self.sigma.to(dtype=q.dtype, device=q.device)
        diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., L, S, E)
        u2 = (diff * diff).sum(-1) / (sigma * sigma)  # (..., L, S) squared scaled distance
        neg_inf = torch.full((), float("-inf"), dtype=q.dtype, device=q.device)
        if self.kernel == "boxcar":
            inside = u2 <= 1
            # log K = 0 inside: written as 0 * u2 so that a learnable σ is in the graph
            # and gets its zero gradient (the weights are piecewise constant in σ)
            return torch.where(inside, u2 * 0, neg_inf)
        inside = u2 < 1
        # Clamp inside log so the branch not taken has a finite gradient (no 0 * inf = NaN).
        safe = torch.where(inside, 1 - u2, torch.ones_like(u2))
        return torch.where(inside, torch.log(safe), neg_inf)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}, sigma={float(self.sigma):g}"


Kernel = Literal["gaussian", CompactKernel]
"""The kernels of :class:`NadarayaWatson`."""

_KERNELS: tuple[str, ...] = get_args(Kernel)


class NadarayaWatson(_KeepsWeights):
    """Nadaraya–Watson kernel regression as attention: f(q) = Σ_j K(q, k_j) v_j / Σ_j K(q, k_j).

    Args:
        kernel: ``"gaussian"`` (K = exp(-‖q-k‖²/(2σ²)), a softmax of the
            Gaussian score), ``"boxcar"`` (K = 1 within distance σ) or
            ``"epanechnikov"`` (K = 1 - ‖q-k‖²/σ² within distance σ).
        sigma: the bandwidth σ > 0.
        learnable: make σ an ``nn.Parameter`` trained by gradient descent
            (the boxcar's σ gets zero gradients: its weights are piecewise constant).
            Each call checks σ where it is readable without a device sync (on the CPU):
            a σ that training or ``load_state_dict`` set to 0, inf or NaN is a
            ValueError naming it, not NaN weights. A negative σ acts as |σ|.

    ``forward(queries, keys, values)`` takes either layout:

    - shared keys: queries (n,) or (n, d), keys (m,) or (m, d), values (m,)
      or (m, dv); every query sees every key; returns (n,) or (n, dv);
    - d2l's training layout: queries (n,), keys (n, m) and values (n, m),
      one row of m scalar keys/values per query; returns (n,).

    A 1-D ``queries`` with 2-D ``keys`` selects the second layout (scalar
    features shared by every query are given as 1-D keys). A query with no
    key inside a compact kernel's support gives 0.
    """

    def __init__(
        self, kernel: Kernel = "gaussian", sigma: float = 1.0, learnable: bool = False
    ) -> None:
        super().__init__()
        if kernel not in _KERNELS:
            raise ValueError(f"NadarayaWatson: kernel must be one of {_KERNELS}, got {kernel!r}")
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)):
            raise TypeError(f"NadarayaWatson: sigma must be a positive float, got {sigma!r}")
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"NadarayaWatson: sigma must be a positive finite float, got {sigma}")
        self.kernel = kernel
        self.score: Score = (
            Gaussian(float(sigma), learnable=learnable)
            if kernel == "gaussian"
            else KernelScore(kernel, float(sigma), learnable=learnable)
        )
        self.attention_weights: torch.Tensor | None = None

    @property
    def sigma(self) -> torch.Tensor:
        """The bandwidth σ (a parameter when learnable)."""
        s = self.score.sigma
        assert isinstance(s, torch.Tensor)
        return s

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}"

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """Predict at ``queries``; the layouts and shapes are in the class docstring.

        The weights, (n, m), are kept in ``.attention_weights``.
        """
        check_compiling()
        owner = "NadarayaWatson"
        for name, t in (("queries", queries), ("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"{owner}: {name} must be a floating-point tensor")
            if t.ndim not in (1, 2):
                raise ValueError(f"{owner}: {name} must be 1-D or 2-D, got {shape_str(t)}")
        _check_dtypes(owner, queries, keys, values)
        # (a learnt σ may have reached 0, or a value whose 1 / (2σ²) overflows)
        check_bandwidth(self.sigma, "NadarayaWatson:", queries.dtype)
        n = queries.shape[0]
        if queries.ndim == 1 and keys.ndim == 2:
            # d2l's training layout: one row of m scalar keys/values per query.
            if keys.shape[0] != n or values.shape != keys.shape:
                raise ValueError(
                    f"{owner}: with 1-D queries ({n},) and 2-D keys the layout is one row per "
                    f"query: keys and values of shape ({n}, m); got keys {shape_str(keys)} and "
                    f"values {shape_str(values)} (for keys shared by every query pass them 1-D)"
                )
            q = queries.view(n, 1, 1)  # (n, L=1, d=1)
            k = keys.unsqueeze(-1)  # (n, m, 1)
            v = values.unsqueeze(-1)  # (n, m, 1)
            out, w = attention(q, k, v, score=self.score, return_weights=True)  # (n, 1, 1)
            self.attention_weights = w.squeeze(1)  # (n, m)
            return out.view(n)

        q = queries if queries.ndim == 2 else queries.unsqueeze(-1)  # (n, d)
        k = keys if keys.ndim == 2 else keys.unsqueeze(-1)  # (m, d)
        v = values if values.ndim == 2 else values.unsqueeze(-1)  # (m, dv)
        _check_same(
            owner, "feature size d", ("queries", queries, q.shape[-1]), ("keys", keys, k.shape[-1])
        )
        _check_same(
            owner, "number m of rows", ("keys", keys, k.shape[0]), ("values", values, v.shape[0])
        )
        out, self.attention_weights = attention(q, k, v, score=self.score, return_weights=True)
        return out if values.ndim == 2 else out.squeeze(-1)
