"""The site's reference: every public name has a docstring and an entry; the CLI page is its parser."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import itertools
import re
import typing
from pathlib import Path
from types import ModuleType

import pytest

from attnkit._namespace import PUBLIC_NAMESPACES
from attnkit.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
DOCS = ROOT / "docs"
HOOKS = DOCS / "hooks"
NAMESPACES = list(PUBLIC_NAMESPACES)
# Public names still waiting for a docstring; the test fails once one has it, so that
# the name leaves this list.
AWAITING_DOCSTRING: set[str] = set()


def _entries() -> set[str]:
    """The objects the reference pages render (their ``::: dotted.path`` lines)."""
    found: set[str] = set()
    for page in sorted(REFERENCE.glob("*.md")):
        found.update(re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), re.M))
    return found


def _attribute_docstring(module: ModuleType, name: str) -> str | None:
    """The string literal after ``name = ...`` in the module's source, if any."""
    tree = ast.parse(inspect.getsource(module))
    body = tree.body
    for statement, following in itertools.pairwise(body):
        targets = []
        if isinstance(statement, ast.Assign):
            targets = [t.id for t in statement.targets if isinstance(t, ast.Name)]
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            targets = [statement.target.id]
        if name in targets and isinstance(following, ast.Expr):
            value = following.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    return None


def _docstring(namespace: ModuleType, name: str) -> str | None:
    obj = getattr(namespace, name)
    alias = typing.get_origin(obj) is not None  # a type alias (Literal[...]): a value
    if not alias and (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)):
        return inspect.getdoc(obj)
    # A value (a constant, a record): its docstring is the string under its assignment,
    # in the namespace or in the module it is imported from.
    modules = [namespace]
    for module in list(vars(namespace).values()):
        if inspect.ismodule(module) and module.__name__.startswith(namespace.__name__):
            modules.append(module)
    for module in modules:
        try:
            doc = _attribute_docstring(module, name)
        except (OSError, TypeError):
            continue
        if doc:
            return doc
    return None


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_every_public_name_has_a_docstring(namespace: str) -> None:
    module = importlib.import_module(namespace)
    missing = {
        f"{namespace}.{name}"
        for name in module.__all__
        if not (_docstring(module, name) or "").strip()
    }
    assert missing == {n for n in AWAITING_DOCSTRING if n.startswith(f"{namespace}.")}


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_every_public_name_has_a_reference_entry(namespace: str) -> None:
    module = importlib.import_module(namespace)
    entries = _entries()
    # (a function exported under the name of its own submodule, attnkit.viz.capture,
    # is rendered by its full path: the short one names the module for griffe)
    missing = sorted(
        f"{namespace}.{n}"
        for n in module.__all__
        if f"{namespace}.{n}" not in entries and f"{namespace}.{n}.{n}" not in entries
    )
    assert not missing, f"no ::: entry in docs/reference/ for {missing}"


def test_every_reference_entry_names_an_object() -> None:
    for entry in sorted(_entries()):
        module_name, _, name = entry.rpartition(".")
        try:
            module = importlib.import_module(entry)
        except ImportError:
            module = importlib.import_module(module_name)
            assert hasattr(module, name), entry


def test_real_return_types_replace_only_any() -> None:
    """The reference's real return types stand in for ``Any`` and nothing else."""
    source = (HOOKS / "griffe_attnkit.py").read_text(encoding="utf-8")
    table = next(
        ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "REAL_RETURNS"
    )
    assert table
    for path in table:
        module_name, _, name = path.rpartition(".")
        function = getattr(importlib.import_module(module_name), name)
        assert inspect.signature(function).return_annotation in ("Any", "typing.Any"), path


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_reference_is_the_commands_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    help_text = capsys.readouterr().out
    page = _hook("cli_reference").command_markdown(command)
    listed = set()  # the options --help lists, each spelling
    for line in help_text.splitlines():
        if line.startswith("  -"):
            listed |= set(re.findall(r"(?:^  |, )(--?[A-Za-z][\w-]*)", line))
    rows = set()  # the options the page's table has a row for
    for line in page.splitlines():
        if line.startswith("| `"):
            rows |= set(re.findall(r"`(--?[A-Za-z][\w-]*)", line.split(" | ")[0]))
    assert rows == listed - {"-h", "--help"}


def test_docstring_layouts_are_normalized() -> None:
    pytest.importorskip("griffe")
    normalize = _hook("griffe_attnkit").normalize
    text = (
        "Summary.\n\nArgs:\n    device, dtype: where the weights live.\n        More.\n"
        "    x: one.\n\nRaises:\n    ValueError, when a shape is wrong\n    or a dtype."
    )
    assert normalize(text) == (
        "Summary.\n\nArgs:\n    device: where the weights live.\n        More.\n"
        "    dtype: where the weights live.\n        More.\n    x: one.\n\nRaises:\n"
        "    ValueError: when a shape is wrong\n        or a dtype."
    )


def test_sphinx_roles_become_optional_links_to_their_full_names() -> None:
    pytest.importorskip("griffe")  # (the docs extra)
    crossrefs = _hook("griffe_attnkit").crossrefs
    full = {"attention": "attnkit.functional.attention", "Mask": "attnkit.masks.base.Mask"}

    def resolve(name: str) -> str:
        return full[name]  # KeyError for a name it does not know, as griffe raises

    text = (
        "See :func:`attention`, :class:`~attnkit.nn.KVCache`, :meth:`Mask.to_dense`, "
        ":mod:`the mods <attnkit.mods>` and :class:`torch.nn.Linear`; :data:`NOPE`."
    )
    assert crossrefs(text, resolve) == (
        'See <autoref identifier="attnkit.functional.attention" optional><code>attention'
        '</code></autoref>, <autoref identifier="attnkit.nn.KVCache" optional><code>KVCache'
        '</code></autoref>, <autoref identifier="attnkit.masks.base.Mask.to_dense" optional>'
        '<code>Mask.to_dense</code></autoref>, <autoref identifier="attnkit.mods" optional>'
        '<code>the mods</code></autoref> and <autoref identifier="torch.nn.Linear" optional>'
        '<code>torch.nn.Linear</code></autoref>; <autoref identifier="NOPE" optional><code>'
        "NOPE</code></autoref>."
    )


def test_simple_tables_become_markdown_tables() -> None:
    pytest.importorskip("griffe")  # (the docs extra)
    tables = _hook("griffe_attnkit").tables
    text = (
        "Intro::\n\n    literal\n\n"
        "==========  ============\nname        meaning\n==========  ============\n"
        "``a|b``     first, in\n            two lines\n``c``       second\n"
        "==========  ============\n\nAfter."
    )
    assert tables(text) == (
        "Intro:\n\n    literal\n\n| name | meaning |\n|---|---|\n"
        "| ``a|b`` | first, in two lines |\n| ``c`` | second |\n\nAfter."
    )


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_the_reference_shows_no_sphinx_markup(namespace: str) -> None:
    pytest.importorskip("griffe")  # (the docs extra)
    # What the site renders from each public docstring: no role or table rule left.
    hook = _hook("griffe_attnkit")
    module = importlib.import_module(namespace)
    for name in [namespace, *getattr(module, "__all__", [])]:
        doc = _docstring(module, name) if name != namespace else inspect.getdoc(module)
        if not doc:
            continue
        shown = hook.crossrefs(hook.tables(hook.normalize(doc)))
        assert not re.search(r":(?:func|class|meth|mod|data|attr|exc):`", shown), name
        assert not re.search(r"^\s*=+(\s+=+)+\s*$", shown, re.M), name


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_no_public_signature_is_only_args_and_kwargs(namespace: str) -> None:
    # scores.Dot, scores.Score and mods.Mod showed (*args, **kwargs), nn.Module's
    module = importlib.import_module(namespace)
    vague = []
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        try:
            params = list(inspect.signature(obj).parameters.values())
        except (TypeError, ValueError):
            continue
        kinds = {p.kind for p in params}
        if kinds == {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
            vague.append(name)
    assert vague == []


def test_tutorials_link_pages_and_title_sections_as_the_site_can() -> None:
    # the notebooks' Markdown is not rewritten: a link to a .md page was a 404, and a
    # heading with inline code got a table-of-contents anchor that does not exist
    for tutorial in sorted((DOCS / "tutorials").glob("*.py")):
        text = tutorial.read_text(encoding="utf-8")
        assert not re.findall(r"\]\([^)#]+\.md[)#]", text), tutorial.name
        assert not re.findall(r"^# #+ .*`", text, re.M), tutorial.name


def test_the_cli_reference_shows_a_default_of_zero() -> None:
    import argparse

    default = _hook("cli_reference")._default
    parser = argparse.ArgumentParser()
    zero = parser.add_argument("--seed", type=int, default=0)
    off = parser.add_argument("--quick", action="store_true")
    assert default(zero) == "`0`" and default(off) == ""


def test_grouped_attributes_and_relative_roles_are_read() -> None:
    pytest.importorskip("griffe")  # (the docs extra)
    hook = _hook("griffe_attnkit")
    text = "Summary.\n\nAttributes:\n    rows, cols: the grid's size."
    assert hook.normalize(text) == (
        "Summary.\n\nAttributes:\n    rows: the grid's size.\n    cols: the grid's size."
    )
    link = hook.crossrefs(":class:`~.masks.SymbolicMask`", lambda name: {"masks": "a.b"}[name])
    assert 'identifier="a.b.SymbolicMask"' in link and "<code>SymbolicMask</code>" in link


def test_offline_hook_finds_assets_from_another_host() -> None:
    remote_assets = _hook("offline").remote_assets
    page = (
        '<link rel="stylesheet" href="https://fonts.example/css"><script src="//cdn.example/x.js">'
        '</script><img src="../images/a.png"><a href="https://example.org/">a link</a>'
        "<style>@import url('https://fonts.example/f.css');</style>"
    )
    assert remote_assets(page) == [
        "https://fonts.example/css",
        "//cdn.example/x.js",
        "https://fonts.example/f.css",
    ]


def test_performance_page_carries_benchmarks_with_site_links() -> None:
    text = _hook("benchmarks").benchmarks_markdown("guides")
    source = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert not text.lstrip().startswith("# ")  # the title is the page's own
    for heading in re.findall(r"^## (.+)$", source, re.M):
        assert f"\n### {heading}\n" in text, heading  # one level down
    for target in re.findall(r"(?<!!)\]\(([^)\s#]+)", text):
        assert not re.match(r"[a-z]+://", target), target
        assert (DOCS / "guides" / target).resolve().is_file(), target


def test_viewer_guide_explains_every_flag_of_show() -> None:
    hook = _hook("cli_reference")
    guide = (DOCS / "guides" / "viewer.md").read_text(encoding="utf-8")
    flags = [f for a in hook.options(hook.command_parser("show")) for f in a.option_strings]
    assert [f for f in flags if f"`{f}" not in guide] == []


def test_attention_and_explain_show_each_parameter_with_its_annotation() -> None:
    import attnkit

    shared = inspect.signature(attnkit.attention).parameters
    assert len(shared) == 16  # query, key, value, 12 keywords and **unexpected
    for func in (attnkit.attention, attnkit.explain):
        params = inspect.signature(func).parameters
        assert list(params) == list(shared)
        for name, p in params.items():
            assert p.annotation is not inspect.Parameter.empty, (func.__name__, name)
            assert p.annotation == shared[name].annotation and p.default == shared[name].default
    assert inspect.signature(attnkit.explain).return_annotation == "Explanation"


def test_reference_shows_the_parameters_explain_shares_with_attention() -> None:
    griffe = pytest.importorskip("griffe")
    hook = _hook("griffe_attnkit")
    module = griffe.load(
        "attnkit.functional",
        search_paths=[str(ROOT / "src")],
        extensions=griffe.load_extensions(hook.AttnkitDocstrings),
    )
    attention, explain = module["attention"], module["explain"]
    shown = [(p.name, str(p.annotation), p.default) for p in explain.parameters]
    assert shown == [(p.name, str(p.annotation), p.default) for p in attention.parameters]
    assert ("score", "ScoreArg", "'scaled_dot'") in shown
    assert str(explain.returns) == "Explanation"
