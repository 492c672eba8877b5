"""Value checksums and score fingerprints of the context-parallel agreement, on one process."""

from __future__ import annotations

import pytest
import torch

from attnkit import scores
from attnkit.distributed import checksum
from attnkit.distributed.agree import score_fingerprint
from attnkit.distributed.checksum import combine, tensor_checksum


def _by_hand(t: torch.Tensor) -> list[int]:
    """(Σ bits, Σ bits·(i+1)) in row-major order, mod 2**64, by Python integers."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.is_floating_point():
        flat = flat + 0.0
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
        flat = flat.view(width)
    bits = [int(b) for b in flat.to(torch.int64).tolist()]
    s0 = sum(bits) % 2**64
    s1 = sum(b * (i + 1) for i, b in enumerate(bits)) % 2**64
    return [(s + 2**63) % 2**64 - 2**63 for s in (s0, s1)]


TENSORS = {
    "float64": lambda: torch.randn(3, 4, 5, dtype=torch.float64),
    "broadcast": lambda: torch.randn(5, 1, 7).expand(5, 6, 7),
    "broadcast_twice": lambda: torch.randn(1, 4, 1).expand(3, 4, 2),
    "transposed": lambda: torch.randn(1, 4).expand(3, 4).t(),
    "sliced_bf16": lambda: torch.randn(3, 5, dtype=torch.bfloat16)[:, ::2],
    "float16": lambda: torch.randn(7, dtype=torch.float16),
    "bool": lambda: torch.rand(2, 1, 3, 4) < 0.5,
    "int": lambda: torch.randint(-9, 9, (4, 3)),
    "scalar": lambda: torch.tensor(2.5, dtype=torch.float64),
    "empty": lambda: torch.zeros(0, 3),
    "non_finite": lambda: torch.tensor([1.0, float("-inf"), float("inf"), float("nan")]),
}


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_checksum_is_the_row_major_weighted_sum_of_bits(name: str) -> None:
    torch.manual_seed(0)
    t = TENSORS[name]()
    assert tensor_checksum(t).tolist() == _by_hand(t)
    assert tensor_checksum(t.contiguous()).tolist() == _by_hand(t)  # layout-independent


def test_large_tensors_are_summed_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    tensors = [TENSORS[n]() for n in ("float64", "broadcast", "transposed", "bool")]
    whole = [tensor_checksum(t) for t in tensors]
    monkeypatch.setattr(checksum, "PIECE", 5)
    for t, w in zip(tensors, whole, strict=True):
        assert torch.equal(tensor_checksum(t), w)


def test_one_changed_or_swapped_element_changes_the_words() -> None:
    torch.manual_seed(2)
    x = torch.randn(4, 6)
    base = tensor_checksum(x)
    nudged = x.clone()
    nudged[2, 3] = torch.nextafter(nudged[2, 3], torch.tensor(float("inf")))
    assert tensor_checksum(nudged)[0] != base[0]
    swapped = x.clone()
    swapped[0, 0], swapped[3, 5] = x[3, 5], x[0, 0]
    got = tensor_checksum(swapped)
    assert got[0] == base[0] and got[1] != base[1]
    zeros, signed = torch.zeros(3), torch.tensor([0.0, -0.0, 0.0])
    assert torch.equal(tensor_checksum(zeros), tensor_checksum(signed))  # -0.0 counts as 0.0


def test_combine_weighs_tensors_by_position() -> None:
    a, b = tensor_checksum(torch.ones(3)), tensor_checksum(torch.arange(3.0))
    cpu = torch.device("cpu")
    assert not torch.equal(combine([a, b], cpu), combine([b, a], cpu))
    assert combine([], cpu).tolist() == [0, 0]


def test_score_fingerprint_sees_settings_and_shapes_not_values() -> None:
    torch.manual_seed(3)
    one, two = scores.Bilinear(4, 4), scores.Bilinear(4, 4)
    assert score_fingerprint(one) == score_fingerprint(two)  # values differ: checksummed apart
    assert score_fingerprint(one) != score_fingerprint(scores.Bilinear(4, 5))
    assert score_fingerprint(scores.ScaledDot(0.5)) != score_fingerprint(scores.ScaledDot(0.25))
    assert score_fingerprint(scores.ScaledDot()) != score_fingerprint(scores.Dot())
