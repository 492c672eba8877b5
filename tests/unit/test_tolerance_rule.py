"""The suite compares float results through tests/tolerance.py, not bare tolerances.

A scan of the test sources: an ``atol=`` or ``rtol=`` whose value holds a number
(``atol=1e-6``, ``rtol=1 / 255``, ``atol=max(2 * err, 1e-5)``) is a tolerance of the
call site's own, outside the rule; the figure belongs in tolerance.py, named and
documented. Exact comparisons (``rtol=0, atol=0`` on one call) are no tolerance, and
the files in ``tolerance.EXCEPTIONS`` keep the literals it counts, for its reasons.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

import tolerance

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

# keyword = value, the value read up to the next top-level comma or closing bracket
_KEYWORD = re.compile(r"\b([ar]tol)\s*=\s*(?!=)")
_NUMBER = re.compile(r"(?<![\w.])\d")


def _value(text: str, start: int) -> str:
    """The expression that starts at ``start``, up to a comma or bracket at its level."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return text[start:i]
            depth -= 1
        elif c in ",\n" and depth == 0:
            return text[start:i]
    return text[start:]


# the text of f-strings comes as FSTRING_MIDDLE from Python 3.12 on
_BLANKED = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def _code_lines(source: str) -> list[str]:
    """The source's lines with comments and the insides of strings blanked out."""
    lines = source.splitlines()
    out = [list(line) for line in lines]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _BLANKED:
            continue
        (r0, c0), (r1, c1) = tok.start, tok.end
        for r in range(r0, r1 + 1):
            row = out[r - 1]
            a = c0 if r == r0 else 0
            b = c1 if r == r1 else len(row)
            row[a:b] = " " * (b - a)
    return ["".join(row) for row in out]


def bare_tolerances(source: str) -> list[tuple[int, str]]:
    """(line, text) of each ``atol=``/``rtol=`` in code (not in a string or a comment)
    whose value holds a number, leaving out exact comparisons (a call whose atol and
    rtol are both 0)."""
    found = []
    lines = source.splitlines()
    for line_no, code in enumerate(_code_lines(source), start=1):
        line = lines[line_no - 1]
        values = {m.group(1): _value(code, m.end()).strip() for m in _KEYWORD.finditer(code)}
        if not values:
            continue
        if values.get("atol") == "0" and values.get("rtol") == "0":
            continue  # exact
        if any(_NUMBER.search(v) for v in values.values()):
            found.append((line_no, line.strip()))
    return found


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
        "bare atol=/rtol= literals; compare through tests/tolerance.py (a named figure with"
        " its reason) or list the file in tolerance.EXCEPTIONS:\n" + "\n".join(offenders)
    )


def test_every_exception_is_documented_and_still_used() -> None:
    for rel, (count, why) in tolerance.EXCEPTIONS.items():
        path = ROOT / rel
        assert path.is_file(), f"{rel}: listed in tolerance.EXCEPTIONS but not a file"
        assert why and rel in (tolerance.__doc__ or ""), f"{rel}: no reason in tolerance.py"
        assert len(bare_tolerances(path.read_text(encoding="utf-8"))) == count, (
            f"{rel}: tolerance.EXCEPTIONS allows {count} literal(s), the file holds another number"
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
        ("torch.testing.assert_close(a, b, atol=0, rtol=0)", False),
        ("assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=GRADCHECK_ATOL)", False),
        ("assert_close_to_scale(a, b, rel=FLOAT64_REL)", False),
        ("x = 1e-6  # atol=1e-6 in a comment", False),
    ],
)
def test_the_scan_tells_a_bare_tolerance_from_a_named_one(line: str, flagged: bool) -> None:
    assert bool(bare_tolerances(line)) is flagged
