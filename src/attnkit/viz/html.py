"""to_html(): one self-contained web page to explore attention weights.

The page needs nothing but a browser: styles, script and data are inline, and
it loads no font, script or image from anywhere. It has a layer selector, head
toggles, a *head view* (queries on the left, keys on the right, one colored
line per head whose opacity is the weight; hover a token to see only its
lines) and a *matrix view* (the weights of the chosen heads as a grid, with
the value under the pointer). The state can be set in the address:
``attention.html#view=matrix&layer=2&heads=0,3&token=4``.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["render_html", "to_html"]


def _as_array(attentions: Any) -> np.ndarray:
    """(layers, heads, Q, K) float32 from a tensor, an array or a list of per-layer weights."""
    if isinstance(attentions, (list, tuple)):
        if not attentions:
            raise ValueError("attentions: expected at least one layer, got an empty list")
        layers = [_as_array(a) for a in attentions]  # each (1, heads, Q, K)
        shapes = {x.shape for x in layers}
        if any(x.shape[0] != 1 for x in layers) or len(shapes) != 1:
            raise ValueError(
                "attentions: a list needs one (heads, Q, K) or (1, heads, Q, K) array per "
                f"layer, all of one shape; got {[tuple(x.shape) for x in layers]}"
            )
        return np.concatenate(layers, axis=0)  # (layers, heads, Q, K)
    if isinstance(attentions, torch.Tensor):
        arr = attentions.detach().to("cpu", torch.float32).numpy()
    else:
        arr = np.asarray(attentions, dtype=np.float32)
    if arr.ndim == 5 and arr.shape[1] == 1:
        arr = arr[:, 0]  # (layers, heads, Q, K): a batch of one, as captured
    if arr.ndim == 3:
        arr = arr[None]  # (1, heads, Q, K): one layer
    if arr.ndim == 2:
        arr = arr[None, None]  # (1, 1, Q, K): one matrix
    if arr.ndim != 4:
        raise ValueError(
            "attentions: expected shape (layers, heads, Q, K), or a list of per-layer "
            f"(heads, Q, K) or (1, heads, Q, K) weights, got {tuple(arr.shape)}"
        )
    if 0 in arr.shape:
        raise ValueError(f"attentions: expected no empty dim, got shape {tuple(arr.shape)}")
    return arr


def _labels(name: str, labels: Sequence[Any] | None, n: int, default: str) -> list[str]:
    if labels is None:
        return [f"{default} {i}" for i in range(n)]
    if isinstance(labels, str):
        raise TypeError(f"{name}: expected a list of {n} strings, got a single str")
    out = [str(t) for t in labels]
    if len(out) != n:
        raise ValueError(f"{name}: expected {n} labels, got {len(out)}")
    return out


def render_html(
    attentions: Any,
    tokens: Sequence[str],
    *,
    key_tokens: Sequence[str] | None = None,
    layer_labels: Sequence[str] | None = None,
    head_labels: Sequence[str] | None = None,
    title: str = "Attention",
    subtitle: str = "",
    meta: Mapping[str, str] | None = None,
) -> str:
    """The page of :func:`to_html` as a string (same arguments, no path)."""
    arr = _as_array(attentions)  # (layers, heads, Q, K)
    n_layers, n_heads, Q, K = arr.shape
    if isinstance(tokens, str):
        raise TypeError("tokens: expected a list of strings, got a single str")
    q_tokens = [str(t) for t in tokens]
    if len(q_tokens) != Q:
        raise ValueError(
            f"tokens: expected {Q} query tokens (weights have Q = {Q}), got {len(q_tokens)}"
        )
    if key_tokens is None:
        if K != Q:
            raise ValueError(
                f"key_tokens: the weights have {K} keys and {Q} queries; pass key_tokens"
            )
        k_tokens = q_tokens
    else:
        k_tokens = [str(t) for t in key_tokens]
        if len(k_tokens) != K:
            raise ValueError(f"key_tokens: expected {K} key tokens, got {len(k_tokens)}")
    if not np.isfinite(arr).all():
        raise ValueError("attentions: contains NaN or infinity")
    # Weights quantized to 16 bits (error <= 7.7e-6), little-endian, base64.
    quant = np.rint(np.clip(arr, 0.0, 1.0) * 65535.0).astype("<u2")  # (layers, heads, Q, K)
    payload = {
        "title": title,
        "subtitle": subtitle,
        "meta": dict(meta or {}),
        "tokens": q_tokens,
        "keyTokens": k_tokens,
        "layers": _labels("layer_labels", layer_labels, n_layers, "layer"),
        "heads": _labels("head_labels", head_labels, n_heads, "head"),
        "shape": [n_layers, n_heads, Q, K],
        "data": base64.b64encode(quant.tobytes()).decode("ascii"),
    }
    # Inside <script type="application/json">: escape "<" so no token can end the element.
    data = json.dumps(payload, ensure_ascii=False).replace("<", "\\u003c")
    return (
        _TEMPLATE.replace("__TITLE__", html.escape(title))
        .replace("__STYLE__", _STYLE)
        .replace("__SCRIPT__", _SCRIPT)
        .replace("__DATA__", data)
    )


def to_html(
    attentions: Any,
    tokens: Sequence[str],
    path: str | Path,
    *,
    key_tokens: Sequence[str] | None = None,
    layer_labels: Sequence[str] | None = None,
    head_labels: Sequence[str] | None = None,
    title: str = "Attention",
    subtitle: str = "",
    meta: Mapping[str, str] | None = None,
) -> Path:
    """Write one self-contained HTML page that shows attention weights.

    Args:
        attentions: (layers, heads, Q, K) weights (tensor or array), or a list
            with one (heads, Q, K) or (1, heads, Q, K) tensor per layer (what
            :func:`attnkit.viz.capture` records for a batch of one).
        tokens: Q query tokens, shown as they are (escaped, never run as HTML).
        path: the file to write (UTF-8).
        key_tokens: K key tokens when the keys are not the queries.
        layer_labels: names of the layers (default ``"layer i"``).
        head_labels: names of the heads (default ``"head i"``).
        title: the page title; subtitle: a line under it (e.g. the sentence).
        meta: a few ``name: value`` facts shown under the title.

    Returns:
        the path written.

    Raises:
        ValueError/TypeError: shapes and labels disagree; OSError: the file
        cannot be written.
    """
    page = render_html(
        attentions,
        tokens,
        key_tokens=key_tokens,
        layer_labels=layer_labels,
        head_labels=head_labels,
        title=title,
        subtitle=subtitle,
        meta=meta,
    )
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__STYLE__</style>
</head>
<body>
<div id="error" class="error" hidden></div>
<header>
  <h1 id="title"></h1>
  <p id="subtitle" class="subtitle"></p>
  <p id="meta" class="meta"></p>
</header>
<nav class="controls">
  <label>Layer <select id="layer"></select></label>
  <span class="views" role="radiogroup" aria-label="View">
    <button type="button" id="view-head" class="view" aria-pressed="true">Head view</button>
    <button type="button" id="view-matrix" class="view" aria-pressed="false">Matrix view</button>
  </span>
  <span class="heads-label">Heads</span>
  <span id="heads" class="heads"></span>
  <button type="button" id="all-heads" class="small">all</button>
  <button type="button" id="one-head" class="small">first</button>
</nav>
<p id="hint" class="hint"></p>
<main>
  <section id="head-view" class="head-view">
    <div id="q-col" class="col q-col"></div>
    <canvas id="lines"></canvas>
    <div id="k-col" class="col k-col"></div>
  </section>
  <section id="matrix-view" class="matrix-view" hidden>
    <div class="matrix-grid">
      <div class="corner"></div>
      <div id="x-labels" class="x-labels"></div>
      <div id="y-labels" class="y-labels"></div>
      <canvas id="matrix"></canvas>
    </div>
    <div id="tooltip" class="tooltip" hidden></div>
  </section>
</main>
<script type="application/json" id="attention-data">__DATA__</script>
<script>__SCRIPT__</script>
</body>
</html>
"""

_STYLE = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --bg: #ffffff; --accent: #2f5fd0; }
* { box-sizing: border-box; }
[hidden] { display: none !important; }
body { margin: 0; padding: 16px 24px 32px; font: 14px/1.4 system-ui, -apple-system, "Segoe UI",
  Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg); background: var(--bg); }
h1 { font-size: 20px; margin: 0 0 4px; }
.subtitle { margin: 0 0 2px; color: var(--fg); font-size: 15px; }
.meta { margin: 0 0 12px; color: var(--muted); font-size: 13px; }
.controls { display: flex; flex-wrap: wrap; gap: 8px 14px; align-items: center; padding: 8px 0 10px;
  border-bottom: 1px solid var(--line); }
select, button { font: inherit; }
select { padding: 2px 6px; }
.views button { border: 1px solid var(--line); background: #f5f6f8; padding: 3px 10px; cursor: pointer; }
.views button:first-child { border-radius: 4px 0 0 4px; }
.views button:last-child { border-radius: 0 4px 4px 0; border-left: none; }
.views button[aria-pressed="true"] { background: var(--accent); color: #fff; border-color: var(--accent); }
.heads-label { color: var(--muted); }
.heads { display: flex; flex-wrap: wrap; gap: 4px; }
.head { min-width: 26px; height: 24px; border-radius: 4px; border: 2px solid transparent; color: #fff;
  font-size: 12px; font-weight: 600; cursor: pointer; padding: 0 5px; opacity: 0.3; }
.head[aria-pressed="true"] { opacity: 1; border-color: #0005; }
.small { border: 1px solid var(--line); background: #f5f6f8; border-radius: 4px; padding: 1px 8px;
  cursor: pointer; font-size: 12px; }
.hint { color: var(--muted); font-size: 13px; margin: 8px 0 12px; }
.head-view { display: flex; align-items: flex-start; }
.col { display: flex; flex-direction: column; }
.q-col { align-items: flex-end; }
.k-col { align-items: flex-start; }
.tok { height: 24px; line-height: 24px; padding: 0 6px; white-space: pre; cursor: default;
  border-radius: 3px; font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace;
  font-size: 13px; }
.tok.active { outline: 2px solid var(--accent); }
canvas#lines { display: block; }
.matrix-grid { display: grid; grid-template-columns: auto auto; align-items: end; justify-content: start; }
.x-labels { display: flex; align-items: flex-end; }
.x-labels span, .y-labels span { overflow: hidden; white-space: pre; color: var(--fg);
  font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.x-labels span { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left;
  padding-top: 4px; }
.y-labels { display: flex; flex-direction: column; align-items: flex-end; align-self: start; }
.y-labels span { text-align: right; padding-right: 4px; }
canvas#matrix { display: block; cursor: crosshair; border: 1px solid var(--line); }
.matrix-view { position: relative; }
.tooltip { position: absolute; pointer-events: none; background: #1d2330ee; color: #fff; padding: 3px 7px;
  border-radius: 4px; font-size: 12px; white-space: pre; }
.error { background: #fde8e8; color: #8a1c1c; border: 1px solid #f3b4b4; padding: 8px 12px;
  border-radius: 4px; margin-bottom: 12px; }
"""

_SCRIPT = r"""
"use strict";
(function () {
  function fail(message) {
    var box = document.getElementById("error");
    box.textContent = "This page could not draw the attention: " + message;
    box.hidden = false;
  }
  window.addEventListener("error", function (ev) { fail(String(ev.message)); });

  var D = JSON.parse(document.getElementById("attention-data").textContent);
  var nL = D.shape[0], nH = D.shape[1], Q = D.shape[2], K = D.shape[3];
  var W = (function () {
    var bin = atob(D.data), n = bin.length / 2, out = new Float32Array(n);
    for (var i = 0; i < n; i++) {
      out[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) / 65535;
    }
    return out;
  })();
  function w(l, h, i, j) { return W[((l * nH + h) * Q + i) * K + j]; }
  function headColor(h, alpha) {
    var hue = (h * 360 / nH + 8) % 360;
    return "hsla(" + hue.toFixed(0) + ", 70%, 45%, " + alpha + ")";
  }

  var state = { layer: 0, heads: [], view: "head", qFocus: null, kFocus: null };
  for (var h0 = 0; h0 < nH; h0++) state.heads.push(true);
  var ROW = 24;
  var $ = function (id) { return document.getElementById(id); };

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function selectedHeads() {
    var out = [];
    for (var h = 0; h < nH; h++) if (state.heads[h]) out.push(h);
    return out;
  }
  function meanWeight(l, heads, i, j) {
    if (!heads.length) return 0;
    var s = 0;
    for (var t = 0; t < heads.length; t++) s += w(l, heads[t], i, j);
    return s / heads.length;
  }

  // ---- static parts
  $("title").textContent = D.title;
  document.title = D.title;
  $("subtitle").textContent = D.subtitle || "";
  $("meta").textContent = Object.keys(D.meta).map(function (k) { return k + ": " + D.meta[k]; })
    .join("  \u00b7  ");
  D.layers.forEach(function (name, l) {
    var o = el("option", "", name); o.value = String(l); $("layer").appendChild(o);
  });
  D.heads.forEach(function (name, h) {
    var b = el("button", "head", String(h));
    b.type = "button"; b.title = name; b.style.background = headColor(h, 1);
    b.addEventListener("click", function (ev) {
      if (ev.shiftKey || ev.metaKey || ev.ctrlKey) { state.heads[h] = !state.heads[h]; }
      else {
        var only = state.heads[h] && selectedHeads().length === 1;
        for (var t = 0; t < nH; t++) state.heads[t] = only ? true : t === h;
      }
      render();
    });
    $("heads").appendChild(b);
  });
  $("layer").addEventListener("change", function () { state.layer = +$("layer").value; render(); });
  $("view-head").addEventListener("click", function () { state.view = "head"; render(); });
  $("view-matrix").addEventListener("click", function () { state.view = "matrix"; render(); });
  $("all-heads").addEventListener("click", function () {
    for (var t = 0; t < nH; t++) state.heads[t] = true; render();
  });
  $("one-head").addEventListener("click", function () {
    for (var t = 0; t < nH; t++) state.heads[t] = t === 0; render();
  });

  // ---- head view: token columns and the lines between them
  function tokenColumn(col, labels, side) {
    labels.forEach(function (text, i) {
      var t = el("div", "tok", text);
      t.dataset.index = String(i);
      t.addEventListener("mouseenter", function () {
        if (side === "q") state.qFocus = i; else state.kFocus = i;
        drawHeadView();
      });
      t.addEventListener("mouseleave", function () {
        state.qFocus = null; state.kFocus = null; drawHeadView();
      });
      col.appendChild(t);
    });
  }
  tokenColumn($("q-col"), D.tokens, "q");
  tokenColumn($("k-col"), D.keyTokens, "k");
  var lines = $("lines");
  var ratio = window.devicePixelRatio || 1;
  var linesW = Math.max(180, Math.min(360, 40 + 8 * Math.max(Q, K)));
  var linesH = ROW * Math.max(Q, K);
  lines.width = linesW * ratio; lines.height = linesH * ratio;
  lines.style.width = linesW + "px"; lines.style.height = linesH + "px";

  function drawHeadView() {
    var ctx = lines.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, linesW, linesH);
    var heads = selectedHeads(), l = state.layer;
    var qf = state.qFocus, kf = state.kFocus;
    ctx.lineWidth = 2;
    for (var t = 0; t < heads.length; t++) {
      var h = heads[t];
      for (var i = 0; i < Q; i++) {
        if (qf !== null && i !== qf) continue;
        for (var j = 0; j < K; j++) {
          if (kf !== null && j !== kf) continue;
          var v = w(l, h, i, j);
          if (v < 0.01) continue;
          ctx.strokeStyle = headColor(h, Math.min(1, v * (qf !== null || kf !== null ? 1 : 0.9)));
          ctx.beginPath();
          ctx.moveTo(0, i * ROW + ROW / 2);
          ctx.lineTo(linesW, j * ROW + ROW / 2);
          ctx.stroke();
        }
      }
    }
    var qs = $("q-col").children, ks = $("k-col").children;
    for (var a = 0; a < qs.length; a++) {
      var shadeQ = kf !== null ? meanWeight(l, heads, a, kf) : 0;
      qs[a].style.background = shadeQ > 0 ? "rgba(47, 95, 208, " + shadeQ.toFixed(3) + ")" : "";
      qs[a].classList.toggle("active", a === qf);
    }
    for (var b = 0; b < ks.length; b++) {
      var shadeK = qf !== null ? meanWeight(l, heads, qf, b) : 0;
      ks[b].style.background = shadeK > 0 ? "rgba(47, 95, 208, " + shadeK.toFixed(3) + ")" : "";
      ks[b].classList.toggle("active", b === kf);
    }
  }

  // ---- matrix view: one canvas cell per (query, key)
  var CELL = Math.max(6, Math.min(30, Math.floor(560 / Math.max(Q, K))));
  var FONT = Math.max(8, Math.min(13, CELL - 3));
  var matrix = $("matrix");
  matrix.width = K * CELL * ratio; matrix.height = Q * CELL * ratio;
  matrix.style.width = K * CELL + "px"; matrix.style.height = Q * CELL + "px";
  function axisLabels(box, labels, horizontal) {
    labels.forEach(function (text) {
      var s = el("span", "", text);
      s.style.fontSize = FONT + "px";
      if (horizontal) { s.style.width = CELL + "px"; s.style.lineHeight = CELL + "px"; }
      else { s.style.height = CELL + "px"; s.style.lineHeight = CELL + "px"; }
      s.title = text;
      box.appendChild(s);
    });
  }
  axisLabels($("x-labels"), D.keyTokens, true);
  axisLabels($("y-labels"), D.tokens, false);

  function drawMatrix() {
    var ctx = matrix.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, K * CELL, Q * CELL);
    var heads = selectedHeads(), l = state.layer;
    for (var i = 0; i < Q; i++) {
      for (var j = 0; j < K; j++) {
        ctx.fillStyle = "rgba(35, 75, 180, " + meanWeight(l, heads, i, j).toFixed(4) + ")";
        ctx.fillRect(j * CELL, i * CELL, CELL, CELL);
      }
    }
  }
  matrix.addEventListener("mousemove", function (ev) {
    var r = matrix.getBoundingClientRect();
    var j = Math.floor((ev.clientX - r.left) / CELL), i = Math.floor((ev.clientY - r.top) / CELL);
    var tip = $("tooltip");
    if (i < 0 || j < 0 || i >= Q || j >= K) { tip.hidden = true; return; }
    var heads = selectedHeads();
    var v = meanWeight(state.layer, heads, i, j);
    tip.textContent = D.tokens[i] + " \u2192 " + D.keyTokens[j] + "   " + v.toFixed(4) +
      (heads.length === 1 ? "" : "  (mean of " + heads.length + " heads)");
    var host = $("matrix-view").getBoundingClientRect();
    tip.style.left = (ev.clientX - host.left + 14) + "px";
    tip.style.top = (ev.clientY - host.top + 14) + "px";
    tip.hidden = false;
  });
  matrix.addEventListener("mouseleave", function () { $("tooltip").hidden = true; });

  // ---- state <-> address
  function readHash() {
    var parts = (location.hash || "").replace(/^#/, "").split("&");
    parts.forEach(function (p) {
      var kv = p.split("="), key = kv[0], val = decodeURIComponent(kv[1] || "");
      if (key === "view" && (val === "head" || val === "matrix")) state.view = val;
      if (key === "layer" && /^\d+$/.test(val) && +val < nL) state.layer = +val;
      if (key === "heads" && val) {
        var want = val.split(",").filter(function (x) { return /^\d+$/.test(x) && +x < nH; });
        if (want.length) for (var t = 0; t < nH; t++) state.heads[t] = want.indexOf(String(t)) >= 0;
      }
      if (key === "token" && /^\d+$/.test(val) && +val < Q) state.qFocus = +val;
    });
  }

  function render() {
    $("layer").value = String(state.layer);
    var hs = $("heads").children;
    for (var h = 0; h < hs.length; h++) hs[h].setAttribute("aria-pressed", String(state.heads[h]));
    var isHead = state.view === "head";
    $("view-head").setAttribute("aria-pressed", String(isHead));
    $("view-matrix").setAttribute("aria-pressed", String(!isHead));
    $("head-view").hidden = !isHead;
    $("matrix-view").hidden = isHead;
    var n = selectedHeads().length;
    $("hint").textContent = isHead
      ? "Hover a token to see where it attends (left: queries) or what attends to it (right: keys). " +
        "Line opacity = weight; one color per head. Click a head to show it alone, shift-click to add it."
      : "Weights of " + (n === 1 ? "head " + selectedHeads()[0] : "the mean of " + n + " heads") +
        "; rows are queries, columns keys. Hover a cell for its value.";
    if (isHead) drawHeadView(); else drawMatrix();
  }

  try {
    readHash();
    render();
    document.body.dataset.ready = "1";
  } catch (e) {
    fail(String(e && e.message ? e.message : e));
    throw e;
  }
})();
"""
