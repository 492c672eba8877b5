"""The suite compares float results through tests/tolerance.py, not bare tolerances.

A scan of the test sources' syntax trees, two kinds of finding:

- A tolerance of the call site's own: a tolerance keyword (``atol=``, ``rtol=``,
  ``rel=``, ``abs=``, ``rel_tol=``, ``abs_tol=``) or a name of that spelling assigned,
  whose value holds a number (``atol=1e-6``, ``rel=1 / 255``, ``atol=max(2 * err,
  1e-5)``), and a number handed positionally as a tolerance (``pytest.approx(x, 1e-3)``,
  ``np.allclose(a, b, 1e-5)``). The figure belongs in tolerance.py, named and documented.
- A bound of the assertion's own: an ``assert`` whose ``<`` or ``<=`` bound holds a
  float below 0.1 (``assert err < 1e-5``, ``assert abs(x - 45.5) < 1e-5``, ``err <= tol +
  1e-3 * b``): a tolerance written as a comparison instead of a keyword.
- A figure of the module's own: a module-level name assigned a float below 0.01, alone
  or in a tuple or dict (``EXACT = 1e-10``, ``TOL = {torch.float32: 1e-4}``): a tolerance
  kept beside the tests instead of in tolerance.py.
- A comparison left at its library's default tolerance: ``assert_close``,
  ``assert_allclose``, ``allclose`` or ``isclose`` called with no tolerance. Their
  defaults are element-wise (torch's float32 default is an ``atol`` of 1e-5 on every
  entry), and the scan cannot tell the dtypes of the operands, so each call says what it
  means: exact (``rtol=0, atol=0``), or through tolerance.py's helpers.

Exact comparisons (``rtol=0, atol=0`` on one call) are no tolerance; ``pytest.approx``
with its default relative 1e-6 and no number of the caller's own is not a finding. The
files in ``tolerance.EXCEPTIONS`` keep the findings it counts, for its reasons.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tolerance

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

_TOLERANCES = {"atol", "rtol", "rel", "abs", "rel_tol", "abs_tol"}
# names assigned a figure: ``rel`` and ``abs`` also name other things (relative positions)
_TOLERANCE_NAMES = {"atol", "rtol", "rel_tol", "abs_tol"}
# calls whose tolerance is theirs when none is given, and how many positional
# arguments come before the first positional tolerance
_DEFAULTED = {"assert_close": None, "assert_allclose": 2, "allclose": 2, "isclose": 2}
_POSITIONAL = {**_DEFAULTED, "approx": 1}


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _holds_number(node: ast.AST) -> bool:
    """Whether a number literal sits in ``node``, leaving out indexes (``w.shape[-1]``)
    and the arguments of tolerance.py's helpers (``printed_rel(5)``: five digits printed
    is a fact about the data, the helper turns it into the figure)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float | complex) and not isinstance(node.value, bool)
    if isinstance(node, ast.Subscript):
        return _holds_number(node.value)
    if isinstance(node, ast.Call) and _name(node) in tolerance.__all__:
        return False
    return any(_holds_number(child) for child in ast.iter_child_nodes(node))


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 0


def _call_findings(call: ast.Call) -> list[int]:
    name = _name(call)
    given = {k.arg: k.value for k in call.keywords if k.arg in _TOLERANCES}
    if set(given) == {"atol", "rtol"} and all(_is_zero(v) for v in given.values()):
        return []  # exact
    found = [v.lineno for v in given.values() if _holds_number(v) and not _is_zero(v)]
    first = _POSITIONAL.get(name)
    if first is not None:
        found += [a.lineno for a in call.args[first:] if _holds_number(a)]
    if name in _DEFAULTED and not given and not any(k.arg is None for k in call.keywords):
        if first is None or len(call.args) <= first:
            found.append(call.lineno)  # the library's default tolerance
    return found


def _bound_findings(test: ast.expr) -> list[int]:
    """Lines of the ``<``/``<=`` comparisons in an assertion whose bound holds a float
    literal below 0.1: the assertion's own tolerance (integers and larger floats are
    counts, shapes and ratios, not rounding figures)."""
    found = []
    for node in ast.walk(test):
        if not isinstance(node, ast.Compare):
            continue
        bounds = [c for op, c in zip(node.ops, node.comparators, strict=True) if
                  isinstance(op, ast.Lt | ast.LtE)]  # fmt: skip
        if any(_small_float(b) for b in bounds):
            found.append(node.lineno)
    return found


def _small_float(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, float) and 0 < node.value < 0.1
    if isinstance(node, ast.Call) and _name(node) in tolerance.__all__:
        return False
    return any(_small_float(child) for child in ast.iter_child_nodes(node))


def _tiny_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, float) and 0 < node.value < 0.01
    if isinstance(node, ast.Tuple | ast.List | ast.Dict):
        return any(_tiny_literal(child) for child in ast.iter_child_nodes(node))
    return False


def _module_figures(tree: ast.Module) -> list[int]:
    """Lines of module-level names assigned a float literal below 0.01 (alone, or in a
    tuple, list or dict): a figure of the file's own."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) for t in targets) and _tiny_literal(node.value):
                found.append(node.lineno)
    return found


def bare_tolerances(source: str) -> list[tuple[int, str]]:
    """(line, text) of each finding in ``source``: a tolerance keyword, tolerance name or
    positional tolerance whose value holds a number, an assertion's ``<`` bound holding a
    small float, or a comparison called without a tolerance; exact comparisons
    (``rtol=0, atol=0``) are no finding."""
    lines = source.splitlines()
    tree = ast.parse(source)
    found: list[int] = _module_figures(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += _call_findings(node)
        elif isinstance(node, ast.Assert):
            found += _bound_findings(node.test)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if names & _TOLERANCE_NAMES and _holds_number(node.value):
                found.append(node.lineno)
    return [(n, lines[n - 1].strip()) for n in sorted(set(found))]


def _test_sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != "tolerance.py")


def test_no_test_file_holds_a_bare_tolerance() -> None:
    offenders = []
    for path in _test_sources():
        rel = path.relative_to(ROOT).as_posix()
        hits = bare_tolerances(path.read_text(encoding="utf-8"))
        allowed = tolerance.EXCEPTIONS.get(rel, (0, ""))[0]
        if len(hits) > allowed:
            offenders += [f"{rel}:{n}: {text}" for n, text in hits]
    assert not offenders, (
        "bare tolerances or default-tolerance comparisons; compare through tests/tolerance.py"
        " (a named figure with its reason), exactly (rtol=0, atol=0), or list the file in"
        " tolerance.EXCEPTIONS:\n" + "\n".join(offenders)
    )


def test_every_exception_is_documented_and_still_used() -> None:
    for rel, (count, why) in tolerance.EXCEPTIONS.items():
        path = ROOT / rel
        assert path.is_file(), f"{rel}: listed in tolerance.EXCEPTIONS but not a file"
        assert why and rel in (tolerance.__doc__ or ""), f"{rel}: no reason in tolerance.py"
        assert len(bare_tolerances(path.read_text(encoding="utf-8"))) == count, (
            f"{rel}: tolerance.EXCEPTIONS allows {count} finding(s), the file holds another number"
        )


@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        ("torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)", True),
        ("np.testing.assert_allclose(a, b, atol=1 / 255)", True),
        ("np.testing.assert_allclose(a, b, rtol=0, atol=max(2 * err, 1e-5))", True),
        ("np.testing.assert_allclose(a, b, atol=1e-6 * np.abs(b).max())", True),
        ("torch.testing.assert_close(a, b, rtol=0, atol=1e-6)", True),
        ("torch.testing.assert_close(a, b,\n    rtol=2e-6)", True),
        ("torch.testing.assert_close(a, b, rtol=0, atol=0)", False),
        ("torch.testing.assert_close(a, b, rtol=0, atol=SOME_NAMED_ATOL)", False),
        ("torch.testing.assert_close(a, b, atol=0, rtol=0)", False),
        ("assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=GRADCHECK_ATOL)", False),
        ("assert_close_to_scale(a, b, rel=FLOAT64_REL)", False),
        ("x = 1.5  # atol=1e-6 in a comment", False),
        ("assert x == pytest.approx(y, rel=1e-12)", True),
        ("assert x == pytest.approx(y, abs=1e-9)", True),
        ("assert x == pytest.approx(y, 1e-3)", True),
        ("assert x == pytest.approx(y, rel=FLOAT64_REL)", False),
        ("assert x == pytest.approx(y)", False),
        ("assert math.isclose(a, b, rel_tol=1e-5)", True),
        ("assert_close_to_scale(a, b, rel=1 / 500)", True),
        ("assert_close_to_scale(a, b, rel=half_step_rel(BYTE_STEP))", False),
        ("assert_close_elementwise(a, b, rel=5 * FLOAT16_REL)", True),
        ("atol = 2e-5", True),
        ("rel = -np.minimum(rel, 0)", False),
        ("assert_close_to_scale(a, b, rel=byte_sum_rel(w.shape[-1]))", False),
        ("assert_close_elementwise(a, b, rel=printed_rel(5))", False),
        ("assert_close_to_scale(a, b, rel=REL[0])", False),
        ("torch.testing.assert_close(a, b)", True),
        ("torch.testing.assert_close(a, b, msg=lambda m: m)", True),
        ("torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)", False),
        ("torch.testing.assert_close(a, b, **EXACT)", False),
        ("np.testing.assert_allclose(r, [[1.0, 0.0]])", True),
        ("assert torch.allclose(a, b)", True),
        ("assert not np.allclose(a, b)", True),
        ("assert np.allclose(a, b, 1e-5)", True),
        ("assert torch.isclose(a, b).all()", True),
        ("assert torch.equal(a, b) and (a == 1).all()", False),
        ("print('assert_close(a, b) rel=1e-3')", False),
        ("assert err < 1e-5", True),
        ("assert abs(out.item() - 45.5) < 1e-5", True),
        ("assert ((a - b).abs() <= tol + 1e-3 * b.abs()).all()", True),
        ("assert 0.5 < ratio < 2.0", False),
        ("assert err <= FLOAT32_REL * scale", False),
        ("assert n < 10 and t <= 0.5", False),
        ("assert err <= half_step_rel(0.01) * scale", False),
        ("ok = err < 1e-5", False),
        ("EXACT = 1e-10", True),
        ("TOL: float = 2e-7", True),
        ("TOLS = {torch.float32: 1e-4, torch.float64: 1e-9}", True),
        ("REPLAY = (1e-8, 1e-6)", True),
        ("STEPS = 32", False),
        ("RATIO = 4.0", False),
        ("def f():\n    eps = 1e-6\n    return eps", False),
    ],
)
def test_the_scan_tells_a_bare_tolerance_from_a_named_one(line: str, flagged: bool) -> None:
    assert bool(bare_tolerances(line)) is flagged
