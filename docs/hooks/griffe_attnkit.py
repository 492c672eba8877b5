"""A griffe extension: read attnkit's docstring conventions, show real return types.

attnkit's docstrings are Google style with two habits the Google parser does not
read on its own, and this extension rewrites them before parsing (the text is
unchanged, only its layout):

- several parameters described together (``device, dtype: where and in what
  dtype...``): one entry per name, each with the shared description;
- a ``Raises:`` entry written as a sentence (``ContextParallelError, the same on
  every rank...``) or continued at the entry's own indentation;
- a list of bullets under a ``Returns:`` (or ``Yields:``) entry, at the entry's own
  indentation: it belongs to the entry's description, not a new entry each;
- Sphinx's cross-reference roles (``:func:`attention```, ``:class:`~attnkit.nn.KVCache```),
  which ``help()`` reads well: each becomes a link to the entry it names when the
  reference has one, and otherwise its name as code (:func:`crossrefs`);
- reStructuredText's simple tables (columns under rules of ``=``): Markdown tables
  (:func:`tables`); a paragraph that ends in ``::`` before its literal block ends in ``:``.

A function whose annotation says ``Any`` because its result depends on its flags
gets the real union in the reference (``REAL_RETURNS``). A function decorated with
``_same_parameters(typed, shown=other)`` (its parameters declared once, on ``other`` in
the same module) shows ``other``'s parameters, as ``inspect.signature`` does at run time.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

# Functions annotated ``-> Any`` whose result is one of a few known types.
REAL_RETURNS = {
    "attnkit.functional.attention": "torch.Tensor | tuple[torch.Tensor, ...]",
}

_SECTION = re.compile(r"^(\w[\w ]*):\s*$")
_GROUPED = re.compile(r"^(\s+)([A-Za-z_]\w*(?:,\s*[A-Za-z_]\w*)+):\s?(.*)$")
_RAISES_ITEM = re.compile(r"^\s+[A-Za-z_][\w.]*(?:\s*[/,]\s*[A-Za-z_][\w.]*)*\s*:(\s|$)")
_RAISES_SENTENCE = re.compile(r"^(\s+)([A-Z]\w*(?:Error|Exception|Warning)),\s+(.*)$")


_ROLE = re.compile(
    r":(?:func|class|meth|mod|data|attr|exc|obj):`(~?)([^`<>]+?)(?:\s*<([^`<>]+)>)?`"
)
_RULE = re.compile(r"^(\s*)(=+)(?:\s+=+)+\s*$")


def crossrefs(text: str, resolve: Any = None, finish: Any = None) -> str:
    """``text`` with each Sphinx role as an optional autorefs link: the link when the
    reference renders the object, its name as code otherwise (no warning either way).

    ``resolve`` turns a name as written (``attention``, ``Mask.to_dense``) into its full
    path (``attnkit.functional.attention``), or raises; unresolved names stay as written.
    ``finish`` maps the full path to the one the reference renders (:func:`_unshadowed`).
    """

    def link(match: re.Match[str]) -> str:
        short, written, explicit = match.groups()
        target = (explicit or written).strip()
        shown = written.strip() if explicit else target
        if short:
            shown = target.rsplit(".", 1)[-1]
        full = target.lstrip(".")  # (``~.masks.X``: relative to the package)
        if resolve is not None and not full.startswith(("attnkit.", "torch.")):
            head, _, rest = full.partition(".")
            try:
                full = resolve(head) + (f".{rest}" if rest else "")
            except Exception:  # a name griffe cannot see (another package's): as written
                full = target.lstrip(".")
        if finish is not None:
            full = finish(full)
        return f'<autoref identifier="{full}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(link, text)


def _cells(line: str, spans: list[tuple[int, int]]) -> list[str]:
    """The text of ``line`` in each column, the last column to the end of the line."""
    cells = []
    for n, (start, end) in enumerate(spans):
        stop = None if n == len(spans) - 1 else spans[n + 1][0]
        cells.append(line[start:stop].strip() if len(line) > start else "")
        del end
    return cells


def tables(text: str) -> str:
    """``text`` with reStructuredText simple tables as Markdown tables.

    A table is a rule (``====  ====``), a header row, a rule, rows and a closing rule;
    a row whose first cell is empty continues the row above it."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        rule = _RULE.match(lines[i])
        closing = None
        if rule and i + 2 < len(lines) and lines[i + 2].strip() == lines[i].strip():
            closing = next(
                (j for j in range(i + 3, len(lines)) if lines[j].strip() == lines[i].strip()),
                None,
            )
        if rule is None or closing is None:
            literal = lines[i].endswith("::") and lines[i].strip() != "::"
            out.append(lines[i][:-1] if literal else lines[i])  # "Example::" -> "Example:"
            i += 1
            continue
        pad = rule.group(1)
        spans = [(m.start(), m.end()) for m in re.finditer(r"=+", lines[i])]
        rows: list[list[str]] = []
        for line in lines[i + 3 : closing]:
            if not line.strip():
                continue
            cells = _cells(line, spans)
            if rows and not cells[0]:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
            else:
                rows.append(cells)
        header = _cells(lines[i + 1], spans)
        out.append(pad + "| " + " | ".join(header) + " |")
        out.append(pad + "|" + "|".join("---" for _ in header) + "|")
        out.extend(pad + "| " + " | ".join(row) + " |" for row in rows)
        i = closing + 1
    return "\n".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def normalize(text: str) -> str:
    """The docstring ``text`` with grouped parameters split and Raises entries as items."""
    lines = text.splitlines()
    out: list[str] = []
    section = ""
    item_indent: int | None = None
    bullet = False  # inside a bullet of a Returns or Yields entry
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = _SECTION.match(line)
        if heading and _indent(line) == 0:
            section, item_indent, bullet = heading.group(1).lower(), None, False
            out.append(line)
            i += 1
            continue
        if not line.strip():
            out.append(line)
            i += 1
            continue
        if _indent(line) == 0:
            section = ""
        if item_indent is None and section:
            item_indent = _indent(line)
        at_item = section and _indent(line) == item_indent
        if at_item and section in ("args", "arguments", "parameters", "params", "attributes"):
            grouped = _GROUPED.match(line)
            if grouped:
                pad, names, first = grouped.groups()
                rest = []
                j = i + 1
                while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > len(pad)):
                    rest.append(lines[j])
                    j += 1
                while rest and not rest[-1].strip():
                    rest.pop()
                for name in re.split(r",\s*", names):
                    out.append(f"{pad}{name}: {first}")
                    out.extend(rest)
                i = j
                continue
        if section in ("returns", "yields") and item_indent is not None:
            if at_item:
                bullet = line.lstrip().startswith(("- ", "* "))
            if bullet and item_indent <= _indent(line) < 2 * item_indent:
                line = " " * item_indent + line  # a continuation of the entry above
        if at_item and section == "raises" and not _RAISES_ITEM.match(line):
            sentence = _RAISES_SENTENCE.match(line)
            if sentence and (not out or _SECTION.match(out[-1])):
                pad, name, first = sentence.groups()
                line = f"{pad}{name}: {first}"
            else:
                line = " " * 4 + line  # a continuation of the entry above
        out.append(line)
        i += 1
    return "\n".join(out)


def _copy_parameters(func: griffe.Function) -> None:
    """``func``'s parameters taken from the sibling its ``_same_parameters`` shows (its
    ``shown=`` argument, the parameters spelt out; else the first)."""
    for decorator in func.decorators:
        call = decorator.value
        if isinstance(call, griffe.ExprCall) and str(call.function) == "_same_parameters":
            named = [a.value for a in call.arguments if isinstance(a, griffe.ExprKeyword)
                     and a.name == "shown"]  # fmt: skip
            source = func.parent.members[str(named[0] if named else call.arguments[0])]
            assert isinstance(source, griffe.Function), source
            func.parameters = source.parameters


class AttnkitDocstrings(griffe.Extension):
    """Normalizes docstrings as they load and sets the real return types."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = tables(normalize(obj.docstring.value))
        if isinstance(obj, griffe.Function):
            _copy_parameters(obj)
        real = REAL_RETURNS.get(obj.path)
        if real is not None and isinstance(obj, griffe.Function):
            if str(obj.returns) != "Any":
                raise ValueError(f"{obj.path} no longer returns Any: remove it from REAL_RETURNS")
            expr = ast.parse(real, mode="eval").body
            obj.returns = griffe.safe_get_annotation(expr, parent=obj.parent)  # type: ignore[arg-type]

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Once every module is loaded (base classes and other modules are known), each
        docstring's roles become links (:func:`crossrefs`, :func:`_resolver`)."""
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = crossrefs(
                    obj.docstring.value, _resolver(obj), lambda full: _unshadowed(pkg, full)
                )


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    """``obj`` and every object defined under it (not aliases of others)."""
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out.extend(_objects(member))  # type: ignore[arg-type]
    return out


def _resolver(obj: griffe.Object) -> Any:
    """name -> the full path of what ``name`` means in ``obj``'s docstring: its scope (as
    griffe resolves it), else a member its class inherits."""

    def resolve(name: str) -> str:
        try:
            full = obj.resolve(name)
        except Exception:
            cls = obj if obj.is_class else obj.parent
            if cls is None or not cls.is_class or name not in cls.all_members:
                raise
            full = cls.all_members[name].path
        return full

    return resolve


def _unshadowed(package: griffe.Module, full: str) -> str:
    """``full``, or its same-named function when ``full`` is a module that holds one (the
    package exports the function under the module's name)."""
    try:
        target = package[full.removeprefix(package.path + ".")]
    except Exception:
        return full
    inner = target.members.get(target.name) if target.is_module else None
    defined = inner is not None and not inner.is_alias and inner.is_function  # (not imports)
    return f"{full}.{target.name}" if defined else full
