"""Dense masks: boolean keep tensors (``keep``, ``block``, ``tf``) and additive biases."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .._host import readable
from ..blockplan.atoms import DNF, DenseBias, DenseKeep
from .base import DenseMask, Mask, check_broadcast_to, slice_last2

__all__ = ["BiasMask", "KeepMask"]


class KeepMask(Mask):
    """Boolean mask, True = may attend, broadcastable to ``(..., L, S)``."""

    kind = "keep"

    def __init__(self, tensor: torch.Tensor, *, source: str = "keep") -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"masks.{source}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.ndim < 1:
            raise ValueError(
                f"masks.{source}: expected a tensor of shape (..., L, S) or (S,), got a 0-d tensor"
            )
        if tensor.dtype != torch.bool:
            raise TypeError(
                f"masks.{source}: expected a bool tensor (True = may attend), got dtype "
                f"{tensor.dtype}; for 0/1 TensorFlow masks use masks.tf, for additive floats "
                "masks.bias"
            )
        self.tensor = tensor
        self.source = source

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        check_broadcast_to(f"masks.{self.source}(...)", self.tensor.shape, (*batch_shape, L, S))

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(keep=self.tensor.to(device))

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return [[DenseKeep(self.tensor.to(device))]]

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return KeepMask(slice_last2(self.tensor, q0, k0, L, S), source=self.source)

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        return KeepMask(fn(self.tensor, "dense"), source=self.source)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)

    def dense_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)


class BiasMask(Mask):
    """Additive float mask broadcastable to ``(..., L, S)``; ``-inf`` blocks a key."""

    kind = "bias"
    additive = True
    _checked: tuple[torch.Tensor, int] | None = None
    """The tensor whose values :meth:`_check_values` last read, and its version then."""
    _beyond: tuple[torch.Tensor, int, float, bool] | None = None
    """:meth:`has_bias_beyond`'s last answer: the tensor it read, its version, the limit
    and the answer."""

    def __init__(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"masks.bias: expected a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(
                f"masks.bias: expected a floating-point tensor, got dtype {tensor.dtype}; "
                "for a boolean mask use masks.keep (True = attend) or masks.block (True = masked)"
            )
        if tensor.ndim < 1:
            raise ValueError("masks.bias: expected a tensor of shape (..., L, S), got a 0-d tensor")
        self.tensor = tensor
        self._check_values()

    def validate(self, batch_shape: Sequence[int], L: int, S: int) -> None:
        check_broadcast_to("masks.bias(...)", self.tensor.shape, (*batch_shape, L, S))
        self._check_values()

    def __getstate__(self) -> dict[str, object]:
        """The mask without its records of values read: a copy (``copy.deepcopy``,
        pickle, ``torch.save``) holds a new tensor whose version restarts, so the copy
        reads its values again at its first call."""
        state = dict(self.__dict__)
        state.pop("_checked", None)
        state.pop("_beyond", None)
        return state

    def _check_values(self) -> None:
        """Refuse a bias holding NaN or +inf: when the mask is made, and again at a call
        after an in-place edit (read once per version of the tensor, as
        :meth:`has_bias_beyond`; an inference-mode tensor keeps no version, so it is read
        once, when made or first set). On an accelerator the values are not read: that
        would sync."""
        t = self.tensor
        if not readable(t):
            return
        seen = self._checked
        inference = t.is_inference()
        if seen is not None and seen[0] is t and (inference or seen[1] == t._version):
            return
        with torch.no_grad():
            if bool(torch.isnan(t).any() | torch.isposinf(t).any()):
                raise ValueError(
                    "masks.bias: the bias contains NaN or +inf; expected finite values or -inf "
                    "(which blocks a key)"
                )
        self._checked = (t, -1 if inference else t._version)

    def dense(self, L: int, S: int, batch_shape: Sequence[int], device: torch.device) -> DenseMask:
        return DenseMask(keep=None, bias=self.tensor.to(device))

    def lower(self, L: int, S: int, device: torch.device) -> DNF:
        return [[DenseBias(self.tensor.to(device))]]

    def has_bias_beyond(self, limit: float) -> bool:
        """Whether the bias holds a finite value beyond ``±limit``: read once per version
        of the tensor (an in-place update reads it again); True on an accelerator."""
        t = self.tensor
        if not readable(t):
            return True
        if t.numel() == 0:  # no value at all (an empty batch or no heads)
            return False
        # an inference-mode tensor keeps no version: it is read every time; a tensor set
        # anew (mask.tensor = other) is read as well, whatever its version
        seen = self._beyond
        if (seen is not None and not t.is_inference() and seen[0] is t
                and seen[1:3] == (t._version, limit)):  # fmt: skip
            return seen[3]
        with torch.no_grad():
            lo, hi = torch.aminmax(t)
            if torch.isneginf(lo):  # -inf blocks a key: the finite values' range
                lo, hi = torch.aminmax(t.masked_fill(torch.isneginf(t), 0.0))
            beyond = float(hi) > limit or float(lo) < -limit
        if not t.is_inference():
            self._beyond = (t, t._version, limit, beyond)
        return beyond

    def _shard(self, q0: int, k0: int, L: int, S: int, total_L: int, total_S: int) -> Mask:
        return self.map_tensors(lambda t, role: slice_last2(t, q0, k0, L, S))

    def map_tensors(self, fn: Callable[[torch.Tensor, str], torch.Tensor]) -> Mask:
        out = BiasMask.__new__(BiasMask)  # the values were checked once, by this mask
        out.tensor = fn(self.tensor, "dense")
        return out

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)

    def dense_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,)


# ------------------------------------------------------------------ constructors


def keep(tensor: torch.Tensor) -> KeepMask:
    """Boolean mask with attnkit's polarity: True = may attend. Shape (..., L, S).

    The polarity of SDPA's bool ``attn_mask`` (``attn_mask=b`` is ``mask=masks.keep(b)``)
    and the opposite of ``torch.nn.MultiheadAttention``'s (use :func:`block` for that).

    Args:
        tensor: bool, True = query ``i`` may attend to key ``j``; shape (..., L, S),
            broadcastable to the call's (*batch, L, S) without growing it: any dim
            may be 1 and leading dims may be left out, so (L, S) is one mask for every
            batch element and head, (B, 1, L, S) one per batch element, and (S,) one
            key mask for every query row. A shape that does not broadcast raises
            ValueError when the mask is used.

    Returns:
        A :class:`KeepMask`. A query row that keeps no key gives output 0, weights 0
        and lse -inf (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor, or not bool (for 0/1 masks use
            :func:`tf`, for additive floats :func:`bias`).
        ValueError: ``tensor`` is 0-d.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)                 # (B, H, L, E)
        >>> keep = torch.tensor([[True, False, False],
        ...                      [False, False, False],        # row 1 keeps no key
        ...                      [True, True, True]])
        >>> out = attnkit.attention(q, k, v, mask=masks.keep(keep))
        >>> out[..., 1, :].abs().sum()
        tensor(0.)
    """
    if isinstance(tensor, torch.Tensor) and tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.keep: expected a bool tensor (True = may attend), got dtype {tensor.dtype}; "
            "for 0/1 TensorFlow masks use masks.tf, for additive floats masks.bias"
        )
    return KeepMask(tensor, source="keep")


def block(tensor: torch.Tensor) -> KeepMask:
    """Boolean mask with torch MHA's polarity: True = masked (may NOT attend).

    The polarity of ``torch.nn.MultiheadAttention``'s bool ``attn_mask`` (True = not
    allowed to attend); ``masks.block(t)`` is ``masks.keep(~t)``.

    Args:
        tensor: bool, True = query ``i`` may NOT attend to key ``j``; shape
            (..., L, S), broadcastable to the call's (*batch, L, S) as for
            :func:`keep` (e.g. (L, S), (B, 1, L, S) or (S,)).

    Returns:
        A :class:`KeepMask` holding ``~tensor``. A query row whose keys are all
        blocked gives output 0, weights 0 and lse -inf (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor, or not bool.
        ValueError: ``tensor`` is 0-d.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)
        >>> future = torch.ones(3, 3, dtype=torch.bool).triu(1)  # True = masked
        >>> a = attnkit.attention(q, k, v, mask=masks.block(future))
        >>> torch.allclose(a, attnkit.attention(q, k, v, mask=masks.causal()))
        True
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masks.block: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bool:
        raise TypeError(
            f"masks.block: expected a bool tensor (True = masked), got dtype {tensor.dtype}"
        )
    return KeepMask(~tensor, source="block")


def bias(tensor: torch.Tensor) -> BiasMask:
    """Additive float mask, shape (..., L, S), added to the logits; ``-inf`` blocks.

    The form of SDPA's float ``attn_mask``: the bias is added to the scaled logits
    (after the score, its ``scale`` and any ``mods``) before the softmax. A float
    tensor passed as ``mask=`` is read as ``masks.bias(tensor)``.

    Args:
        tensor: floating-point, added to the logit of query ``i`` and key ``j``;
            ``-inf`` blocks the key exactly, any finite value (a large negative one
            too) only weighs it. Shape (..., L, S), broadcastable to the call's
            (*batch, L, S) as for :func:`keep`; a learnable bias that requires grad
            gets its gradient.

    Returns:
        A :class:`BiasMask`. A query row whose bias is ``-inf`` for every key gives
        output 0, weights 0 and lse -inf (no NaN); a row of ``-1e9`` instead is not
        masked: its keys still share the weights, as in torch's own softmax (in
        float32 ``q·k - 1e9`` rounds to a multiple of 64, so the keys whose ``q·k``
        rounds highest share the row; at ``-1e30`` every key rounds alike and the row
        spreads evenly), with exact gradients on every backend (see the NaN guide).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor or not floating-point (for bool
            masks use :func:`keep` or :func:`block`).
        ValueError: ``tensor`` is 0-d, or holds NaN or +inf (checked for a CPU
            tensor; an accelerator's values are not read, which would sync).

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)
        >>> b = torch.zeros(3, 3)
        >>> b[:, 2] = float("-inf")                            # no query sees key 2
        >>> _, w = attnkit.attention(q, k, v, mask=masks.bias(b), return_weights=True)
        >>> w[..., 2].abs().sum()
        tensor(0.)
    """
    return BiasMask(tensor)


def tf(tensor: torch.Tensor) -> KeepMask:
    """TensorFlow tutorial convention: 1 = masked, 0 = attend; shape (..., L, S).

    The tutorial adds ``mask * -1e9`` to the logits; attnkit blocks exactly, so a
    fully masked row gives zeros instead of a uniform average.

    Args:
        tensor: 0/1 values of any dtype (int, float or bool; True counts as 1),
            1 = masked, 0 = may attend. Shape (..., L, S), broadcastable to the call's
            (*batch, L, S) as for :func:`keep`: the tutorial's padding mask
            (B, 1, 1, S) and look-ahead mask (L, S) work as they are.

    Returns:
        A :class:`KeepMask` holding ``tensor == 0``. A fully masked row gives output
        0, weights 0 and lse -inf (no NaN).

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor.
        ValueError: ``tensor`` holds a value other than 0 and 1 (checked for a CPU
            tensor; an accelerator's values are not read), or is 0-d.

    Examples:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> q = k = v = torch.randn(2, 4, 3, 8)
        >>> look_ahead = 1 - torch.ones(3, 3).tril()           # 1 above the diagonal
        >>> a = attnkit.attention(q, k, v, mask=masks.tf(look_ahead))
        >>> torch.allclose(a, attnkit.attention(q, k, v, mask=masks.causal()))
        True
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masks.tf: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.bool and readable(tensor):  # (a device tensor is not read: sync)
        bad = (tensor != 0) & (tensor != 1)
        if bool(bad.any()):
            raise ValueError(
                "masks.tf: expected values 0 (attend) and 1 (masked) only, got "
                f"{tensor[bad].flatten()[:3].tolist()}"
            )
    return KeepMask(tensor == 0, source="tf")
