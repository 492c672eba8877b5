"""dir() of every public namespace lists what it exports (its ``__all__``), sorted."""

from __future__ import annotations

import importlib

import pytest

from attnkit._namespace import PUBLIC_NAMESPACES

NAMESPACES = list(PUBLIC_NAMESPACES)


@pytest.mark.parametrize("name", NAMESPACES)
def test_dir_lists_exports_only(name: str) -> None:
    if name.endswith(".transformers"):
        pytest.importorskip("transformers")
    module = importlib.import_module(name)
    listed = dir(module)
    assert listed == sorted(module.__all__)
    for imported in ("torch", "math", "nn", "annotations", "importlib"):
        if imported not in module.__all__:
            assert imported not in listed
    for exported in module.__all__:  # every listed name resolves
        assert getattr(module, exported) is not None


def test_dir_of_scores_names_no_imports() -> None:
    import attnkit.scores

    assert {"math", "nn", "torch"}.isdisjoint(dir(attnkit.scores))


def test_viz_export_is_reached_as_the_viewer_guide_writes_it() -> None:
    # attnkit.viz.export.load_weights raised AttributeError until an explicit import;
    # the package's own __getattr__ is asked (another test may have imported it already)
    import attnkit.viz

    export = attnkit.viz.__getattr__("export")
    assert callable(export.load_weights) and callable(export.save_weights)
