"""attnkit.viz.to_html: one self-contained page, checked in headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit import viz

TOKENS = ["[CLS]", "the", "cat", "sat", "</script><b>x</b>", "mat", "[SEP]"]


def _weights(layers: int = 2, heads: int = 3, L: int = len(TOKENS)) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.softmax(torch.randn(layers, heads, L, L) * 2, dim=-1)  # (layers, heads, L, L)


def _payload(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_page_is_self_contained(tmp_path: Path) -> None:
    path = viz.to_html(_weights(), TOKENS, tmp_path / "a.html", title="t", meta={"model": "m"})
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "http:" not in page and "https:" not in page and "//cdn" not in page
    assert not re.search(r"<(link|img|iframe)\b", page)
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert "@import" not in page and "url(" not in page
    # The hostile token cannot close the data element early: exactly two </script>.
    assert page.count("</script>") == 2


def test_data_round_trips(tmp_path: Path) -> None:
    w = _weights()
    page = viz.to_html(w, TOKENS, tmp_path / "a.html").read_text(encoding="utf-8")
    data = _payload(page)
    assert data["tokens"] == TOKENS and data["keyTokens"] == TOKENS
    assert data["shape"] == [2, 3, 7, 7]
    assert data["layers"] == ["layer 0", "layer 1"] and data["heads"][2] == "head 2"
    raw = np.frombuffer(base64.b64decode(data["data"]), dtype="<u2").reshape(2, 3, 7, 7)
    np.testing.assert_allclose(raw / 65535.0, w.numpy(), atol=1e-5)


def test_accepts_captured_layers_and_cross_attention(tmp_path: Path) -> None:
    per_layer = [w[None] for w in _weights()]  # each (1, heads, L, L)
    page = viz.render_html(per_layer, TOKENS)
    assert _payload(page)["shape"] == [2, 3, 7, 7]
    cross = torch.softmax(torch.randn(1, 2, 3, 5), dim=-1)  # (layers, heads, Q, K)
    page = viz.render_html(cross, ["a", "b", "c"], key_tokens=list("vwxyz"))
    assert _payload(page)["keyTokens"] == list("vwxyz")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="query tokens"):
        viz.render_html(_weights(), TOKENS[:3])
    with pytest.raises(ValueError, match="key_tokens"):
        viz.render_html(torch.rand(1, 1, 2, 3), ["a", "b"])
    with pytest.raises(ValueError, match="layers, heads, Q, K"):
        viz.render_html(torch.rand(2, 2, 1, 1, 3, 3), ["a"] * 3)
    with pytest.raises(ValueError, match="NaN"):
        viz.render_html(torch.full((1, 1, 2, 2), float("nan")), ["a", "b"])


# --------------------------------------------------------------------------- in a browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian package 'chromium')"
)


def _chromium(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND",  # any network access fails loudly
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                *extra,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
@pytest.mark.parametrize("view", ["view=head&token=2&layer=1", "view=matrix&heads=1"])
def test_page_renders_without_console_errors(tmp_path: Path, view: str) -> None:
    path = viz.to_html(_weights(), TOKENS, tmp_path / "a.html", title="Attention test")
    done = _chromium(path.resolve().as_uri() + "#" + view, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_lines(done.stderr) == []
    dom = done.stdout
    assert 'data-ready="1"' in dom  # the script ran to its end
    assert re.search(r'<div id="error"[^>]*hidden', dom)  # no error banner
    for token in ("[CLS]", "cat", "[SEP]", "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;"):
        assert token in dom
    assert dom.count('class="tok') >= 2 * len(TOKENS)  # both token columns
    assert "<b>x</b>" not in dom  # tokens are text, never markup


@needs_chromium
def test_screenshot(tmp_path: Path) -> None:
    path = viz.to_html(_weights(), TOKENS, tmp_path / "a.html")
    shot = tmp_path / "shot.png"
    done = _chromium(
        path.resolve().as_uri() + "#token=2",
        f"--screenshot={shot}",
        "--window-size=1000,700",
        "--hide-scrollbars",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_lines(done.stderr) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1000, 700)
