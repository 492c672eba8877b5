"""``attnkit explain``: which backend runs an attention call of given shapes, and why.

Nothing the size of the call is ever allocated, so any sizes can be asked about: the
call is described on the CPU with shape-only views (one element per tensor, expanded
to the full shape with zero strides) and handed to :func:`attnkit.explain`, which
validates it as :func:`attnkit.attention` would (a call attention() would refuse is
refused here with its message) and reads shapes, dtypes and flags. One thing dispatch
reads is a value: a Gaussian score's form (dot products or differences) is chosen from
the inputs' norms, which a description does not have; a Gaussian call is described
without host reads (:func:`attnkit._host.device_semantics`: as on an accelerator), and the
answer says so.

``--gpu-targets`` answers another question: whether the triton backend's kernels
compile and fit on each NVIDIA GPU generation (see
:mod:`attnkit.backends.triton.targets`; needs triton, not a GPU).

``--transformers`` answers a third: what the installed transformers offers
``attn_implementation="attnkit"`` (see :mod:`attnkit.integrations.transformers.features`),
naming for anything it lacks the release that has it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from .. import _score_names as score_names
from .. import masks, scores
from .._host import device_semantics
from ..backends.dispatch import Explanation
from ..functional import explain

DESCRIPTION = "which backend runs a call of given shapes, and why"

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

MASK_HELP = {
    "none": "no mask",
    "causal": 'masks.causal("top_left")',
    "window": "masks.window(min(128, S), 0)",
    "valid_lens": "masks.valid_lens(lens), every length S",
    "key_padding": "masks.key_padding(pad) of shape (B, S), no padding",
}
"""The masks ``--mask`` describes, as the call passes them."""

MAX_BYTES = 2**62
"""Largest size in bytes of any described tensor (torch counts a storage's bytes in
int64): the inputs, a learned score's (E, E) weights and, asked for, the (B, H, L, S)
weights."""


TensorFactory = Callable[..., torch.Tensor]
"""(shape, dtype, requires_grad, fill=0) -> a tensor describing that shape."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=2, help="batch size B (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=8, help="heads H (default: %(default)s)")
    parser.add_argument(
        "-L", "--queries", type=int, default=512, help="query length L (default: %(default)s)"
    )
    parser.add_argument(
        "-S", "--keys", type=int, default=None, help="key length S (default: L, as -L gives it)"
    )
    parser.add_argument(
        "-E", "--dim", type=int, default=64, help="feature dim E (default: %(default)s)"
    )
    parser.add_argument(
        "--score",
        default="scaled_dot",
        choices=score_names.ALL,
        help=f"the score: {', '.join(score_names.NAMED)} as attention(score=NAME) takes them; "
        "bilinear and additive hold weights, so the call described passes the object "
        "scores.Bilinear(E, E) or scores.Additive(E, E, E) (default: %(default)s)",
    )
    parser.add_argument(
        "--mask",
        default="none",
        choices=list(MASK_HELP),
        help="the mask: "
        + "; ".join(f"{name}: {what}" for name, what in MASK_HELP.items())
        + " (default: %(default)s)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=sorted(_DTYPES),
        help="dtype of query, key and value (default: %(default)s)",
    )
    parser.add_argument(
        "--weights", action="store_true", help="ask for the attention weights (default: off)"
    )
    parser.add_argument("--lse", action="store_true", help="ask for the log-sum-exp (default: off)")
    parser.add_argument(
        "--grad", action="store_true", help="inputs require gradients (default: off)"
    )
    parser.add_argument(
        "--gpu-targets",
        action="store_true",
        help="instead: compile the triton kernels for every NVIDIA target (sm_75 to sm_90, "
        "no GPU needed) and print shared memory and register spills per target (default: off)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="with --gpu-targets: the whole matrix, slow (default: off)",
    )
    parser.add_argument(
        "--transformers",
        action="store_true",
        help="instead: what the installed transformers offers "
        'attn_implementation="attnkit" (default: off)',
    )


def _fail(message: str) -> int:
    print(f"attnkit explain: error: {message}", file=sys.stderr)
    return 2


def shape_only_cpu_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, grad: bool, fill: float = 0
) -> torch.Tensor:
    """A CPU tensor of ``shape`` whose every element is ``fill``, backed by one element
    (zero strides): nothing is allocated for its size."""
    one = torch.full((1,) * len(shape), fill, dtype=dtype, requires_grad=grad)  # (1, ..., 1)
    return one.expand(shape)  # shape, all strides 0


def _score(
    name: str, E: int, dtype: torch.dtype, make: TensorFactory
) -> scores.ScoreName | scores.Score:
    if name not in score_names.NEEDS_WEIGHTS:
        return cast(scores.ScoreName, name)  # a string attention(score=...) takes
    built = score_names.build_with_weights(name, E, device="meta", dtype=dtype)
    # Parameters as described tensors too: (E, E) weights would be allocated otherwise.
    for module in built.modules():
        for pname, param in list(module._parameters.items()):
            if param is not None:
                data = make(tuple(param.shape), dtype, False)
                module._parameters[pname] = nn.Parameter(data, requires_grad=param.requires_grad)
    return built


def _mask(name: str, B: int, S: int, make: TensorFactory) -> masks.Mask | None:
    if name == "none":
        return None
    if name == "causal":
        return masks.causal()
    if name == "window":
        return masks.window(min(128, S), 0)
    if name == "valid_lens":
        return masks.valid_lens(make((B,), torch.long, False, S))  # (B,), every length S
    return masks.key_padding(make((B, S), torch.bool, False))  # (B, S), no padding


def _describe(args: argparse.Namespace, sizes: dict[str, int], make: TensorFactory) -> Explanation:
    B, H, L, S, E = (sizes[k] for k in ("B", "H", "L", "S", "E"))
    dtype = _DTYPES[args.dtype]
    q = make((B, H, L, E), dtype, args.grad)  # (B, H, L, E)
    k = make((B, H, S, E), dtype, args.grad)  # (B, H, S, E)
    return explain(
        q,
        k,
        k,
        score=_score(args.score, E, dtype, make),
        mask=_mask(args.mask, B, S, make),
        return_weights=args.weights,
        return_lse=args.lse,
    )


def _transformers_report() -> int:
    try:
        from ..integrations.transformers import report
    except ImportError as exc:
        return _fail(str(exc).splitlines()[0])
    print(report())
    return 0


def run(args: argparse.Namespace) -> int:
    if args.transformers:
        return _transformers_report()
    if args.gpu_targets:
        from ..backends.triton.targets import main as targets_main

        return targets_main(["--full"] if args.full else [])
    for name in ("batch", "heads", "queries", "dim"):
        if getattr(args, name) < 1:
            return _fail(f"--{name} must be >= 1, got {getattr(args, name)}")
    L = args.queries
    S = args.keys if args.keys is not None else L
    if S < 1:
        return _fail(f"--keys must be >= 1, got {S}")
    sizes = {"B": args.batch, "H": args.heads, "L": L, "S": S, "E": args.dim}
    B, H, E = args.batch, args.heads, args.dim
    itemsize = torch.empty((), dtype=_DTYPES[args.dtype]).element_size()
    largest = itemsize * max(B * H * L * E, B * H * S * E, E * E)
    if args.weights:  # in float32 for half inputs
        largest = max(largest, max(itemsize, 4) * B * H * L * S)
    if largest > MAX_BYTES:
        return _fail(
            f"sizes too large: a tensor of this call would take {largest:.3e} bytes; "
            f"expected at most 2**62 ({MAX_BYTES:.3e})"
        )
    described = "the CPU (shape-only views)"
    reads: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if args.score == "gaussian":  # its form is chosen from values this description lacks
        reads = device_semantics()
        described += "; the Gaussian's form is chosen from the inputs' values, not read here"
    try:
        with reads:
            ex = _describe(args, sizes, shape_only_cpu_tensor)
    except (ValueError, TypeError, RuntimeError) as exc:  # (torch's own, one line too)
        return _fail(str(exc).splitlines()[0])
    elements = B * H * (L + 2 * S) * E
    print(
        f"attention(query {(B, H, L, E)}, key/value {(B, H, S, E)}, score={args.score}, "
        f"mask={args.mask}, dtype={args.dtype}): inputs {_gib(elements * itemsize)} GiB, "
        f"answered for {described}"
    )
    print(ex)
    return 0


def _gib(nbytes: int) -> str:
    gib = nbytes / 2**30
    return f"{gib:.3g}" if gib < 1e6 else f"{gib:.3e}"
