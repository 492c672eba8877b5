"""The mask and modifier kinds come from their classes: backends read the lists there."""

from __future__ import annotations

import torch

import attnkit
from attnkit import masks, mods
from attnkit.backends import base
from attnkit.masks.base import Mask, mask_kinds
from attnkit.mods.base import Mod, backend_mod_kinds


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_backends_read_the_kinds_off_the_classes() -> None:
    assert base.ALL_MASK_KINDS == mask_kinds()
    assert base.ALL_MOD_KINDS == backend_mod_kinds()
    classes = [c for c in _subclasses(Mask) if c.__module__.startswith("attnkit.")]
    assert {c.kind for c in classes if c.kind_reported} == mask_kinds()
    assert "and" not in mask_kinds() and {"or", "not"} <= mask_kinds()
    mod_classes = [c for c in _subclasses(Mod) if c.__module__.startswith("attnkit.")]
    assert {c.kind for c in mod_classes if c.in_backends and "kind" in vars(c)} == (
        backend_mod_kinds()
    )
    assert "sinks" not in backend_mod_kinds()


def test_every_kind_a_mask_reports_is_known() -> None:
    lens = torch.tensor([3, 5])
    pad = torch.zeros(2, 6, dtype=torch.bool)
    made = [
        masks.causal() & masks.valid_lens(lens) & masks.key_padding(pad),
        masks.window(2, 1) | ~masks.prefix_lm(lens),
        masks.document(torch.zeros(2, 6, dtype=torch.long)),
        masks.bias(torch.zeros(6, 6)) & masks.keep(torch.ones(6, 6, dtype=torch.bool)),
    ]
    for m in made:
        assert m.kinds() <= mask_kinds(), m.kinds()
        assert "and" not in m.kinds()
    assert mods.alibi(4).kind in backend_mod_kinds()
    assert attnkit.mods.sinks(torch.zeros(4)).kind not in backend_mod_kinds()
