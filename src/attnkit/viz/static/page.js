"use strict";
(function () {
  var $ = function (id) { return document.getElementById(id); };
  function fail(message) {
    var box = $("error");
    box.textContent = "This page could not draw the attention: " + message;
    box.hidden = false;
  }
  window.addEventListener("error", function (ev) { fail(String(ev.message)); });

  var D = JSON.parse($("attention-data").textContent);

  // ---- data: one byte per weight, quantized per (layer, head) with its own scale
  function bytesOf(text) {
    var bin = atob(text), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function inflate(bytes) {
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser cannot decompress the data (no DecompressionStream)"));
    }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) { return new Uint8Array(buf); });
  }
  function decode(set) {
    var raw = bytesOf(set.data);
    return (set.encoding === "deflate" ? inflate(raw) : Promise.resolve(raw)).then(function (w) {
      var n = set.shape[0] * set.shape[1] * set.shape[2] * set.shape[3];
      if (w.length !== n) throw new Error("expected " + n + " weights, got " + w.length);
      set.bytes = w;
      set.scaleOf = new Float32Array(set.scales);
      return set;
    });
  }

  // ---- colour scale: a white-to-blue ramp, mapped linearly, by square root or by log
  var RAMP = [[255, 255, 255], [212, 226, 247], [127, 166, 224], [47, 95, 208], [13, 36, 99]];
  var LUT = new Uint8Array(256 * 3);
  for (var c = 0; c < 256; c++) {
    var x = c / 255 * (RAMP.length - 1), k0 = Math.min(RAMP.length - 2, Math.floor(x)), f = x - k0;
    for (var ch = 0; ch < 3; ch++) LUT[3 * c + ch] = Math.round(RAMP[k0][ch] * (1 - f) + RAMP[k0 + 1][ch] * f);
  }
  var LOG_FLOOR = 1e-3;
  function toUnit(v, vmax, scale) {
    if (!(vmax > 0) || !(v > 0)) return 0;
    var t = v / vmax;
    if (scale === "power") return Math.sqrt(Math.min(1, t));
    if (scale === "log") return t <= LOG_FLOOR ? 0 : Math.min(1, 1 - Math.log(t) / Math.log(LOG_FLOOR));
    return Math.min(1, t);
  }
  function fmt(v) {
    if (v === 0) return "0";
    return v >= 0.01 ? v.toFixed(3) : v.toExponential(1);
  }

  // ---- state
  var state = { set: 0, layer: 0, heads: [], view: "head", qFocus: null, kFocus: null,
                scale: D.scale || "linear", filter: "all", zoom: 0, openIn: "matrix" };
  var S = null, nL = 0, nH = 0, Q = 0, K = 0;
  var ROW = 24;
  var LONG = 96 * 96;  // above this many (query, key) pairs, the page starts in the matrix view
  var ratio = window.devicePixelRatio || 1;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function headColor(h, alpha) {
    var hue = (h * 360 / nH + 8) % 360;
    return "hsla(" + hue.toFixed(0) + ", 70%, 45%, " + alpha + ")";
  }
  function selectedHeads() {
    var out = [];
    for (var h = 0; h < nH; h++) if (state.heads[h]) out.push(h);
    return out;
  }
  function w(l, h, i, j) {
    return S.bytes[((l * nH + h) * Q + i) * K + j] * S.scaleOf[l * nH + h] / 255;
  }
  // Rows [r0, r1) and columns [c0, c1) that the sentence-pair filter keeps.
  function region() {
    var r = [0, Q, 0, K];
    if (S.pairStart === null || state.filter === "all") return r;
    var qa = state.filter.charAt(0) === "A", ka = state.filter.charAt(1) === "A";
    var qs = S.pairStart, ks = S.pairKeyStart;
    return [qa ? 0 : qs, qa ? qs : Q, ka ? 0 : ks, ka ? ks : K];
  }
  function meanMatrix(l, heads, reg) {
    var rows = reg[1] - reg[0], cols = reg[3] - reg[2], out = new Float32Array(rows * cols);
    for (var t = 0; t < heads.length; t++) {
      var h = heads[t], base = (l * nH + h) * Q * K, sc = S.scaleOf[l * nH + h] / 255 / heads.length;
      for (var i = 0; i < rows; i++) {
        var src = base + (reg[0] + i) * K + reg[2], dst = i * cols;
        for (var j = 0; j < cols; j++) out[dst + j] += S.bytes[src + j] * sc;
      }
    }
    return out;
  }
  function maxOf(a) { var m = 0; for (var i = 0; i < a.length; i++) if (a[i] > m) m = a[i]; return m; }

  // ---- static parts
  function header() {
    $("title").textContent = D.title;
    document.title = D.title;
    $("subtitle").textContent = D.subtitle || "";
    $("meta").textContent = Object.keys(D.meta).map(function (k) { return k + ": " + D.meta[k]; })
      .join("  \u00b7  ");
    if (D.notes && D.notes.length) { $("notes").textContent = D.notes.join(" "); $("notes").hidden = false; }
    D.sets.forEach(function (set, i) {
      var o = el("option", "", set.name); o.value = String(i); $("set").appendChild(o);
    });
    $("set-box").hidden = D.sets.length < 2;
    $("scale").value = state.scale;
  }

  function setupSet() {
    S = D.sets[state.set];
    nL = S.shape[0]; nH = S.shape[1]; Q = S.shape[2]; K = S.shape[3];
    state.layer = Math.min(state.layer, nL - 1);
    if (state.heads.length !== nH) { state.heads = []; for (var h = 0; h < nH; h++) state.heads.push(true); }
    if (S.pairStart === null) state.filter = "all";
    clear($("layer"));
    S.layers.forEach(function (name, l) {
      var o = el("option", "", name); o.value = String(l); $("layer").appendChild(o);
    });
    clear($("heads"));
    S.heads.forEach(function (name, h) {
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
    clear($("pair"));
    $("pair-box").hidden = S.pairStart === null;
    ["all", "AA", "AB", "BA", "BB"].forEach(function (f) {
      var b = el("button", "", f === "all" ? "all" : f.charAt(0) + "\u2192" + f.charAt(1));
      b.type = "button"; b.dataset.filter = f;
      b.title = f === "all" ? "every query and key"
        : "queries of sentence " + f.charAt(0) + ", keys of sentence " + f.charAt(1);
      b.addEventListener("click", function () { state.filter = f; render(); });
      $("pair").appendChild(b);
    });
    if (!state.zoom) state.zoom = Math.max(2, Math.min(30, Math.floor(640 / Math.max(Q, K))));
    buildHeadView();
    thumbsBuilt = false;
  }

  // ---- head view: token columns and the lines between them
  var lines = $("lines"), linesW = 0, linesH = 0;
  function tokenColumn(col, labels, side, start) {
    clear(col);
    labels.forEach(function (text, i) {
      var t = el("div", "tok", text);
      if (start !== null && i === start) t.classList.add("divider");
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
  function buildHeadView() {
    tokenColumn($("q-col"), S.tokens, "q", S.pairStart);
    tokenColumn($("k-col"), S.keyTokens, "k", S.pairKeyStart);
    linesW = Math.max(180, Math.min(360, 40 + 8 * Math.max(Q, K)));
    linesH = ROW * Math.max(Q, K);
    lines.width = Math.round(linesW * ratio); lines.height = Math.round(linesH * ratio);
    lines.style.width = linesW + "px"; lines.style.height = linesH + "px";
  }
  function drawHeadView() {
    var ctx = lines.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, linesW, linesH);
    var heads = selectedHeads(), l = state.layer, reg = region();
    var qf = state.qFocus, kf = state.kFocus;
    // Long inputs: with no token hovered, only each query's strongest key per head.
    var sparse = qf === null && kf === null && (reg[1] - reg[0]) * (reg[3] - reg[2]) > LONG;
    ctx.lineWidth = 2;
    var BUCKETS = 16;
    if (sparse) {
      // Long inputs, nothing hovered: one line per query, to its strongest key (mean of the heads).
      var m = heads.length ? meanMatrix(l, heads, reg) : new Float32Array(0), cols = reg[3] - reg[2];
      ctx.strokeStyle = "rgba(47, 95, 208, 0.55)";
      ctx.beginPath();
      for (var r = 0; r < reg[1] - reg[0]; r++) {
        var bj = -1, bv = 0.01;
        for (var c = 0; c < cols; c++) if (m[r * cols + c] > bv) { bv = m[r * cols + c]; bj = c; }
        if (bj < 0) continue;
        ctx.moveTo(0, (reg[0] + r) * ROW + ROW / 2);
        ctx.lineTo(linesW, (reg[2] + bj) * ROW + ROW / 2);
      }
      ctx.stroke();
    }
    for (var t = 0; t < heads.length && !sparse; t++) {
      var h = heads[t];
      // One path per opacity bucket: a few strokes per head.
      var paths = [];
      for (var b = 0; b < BUCKETS; b++) paths.push([]);
      for (var i = reg[0]; i < reg[1]; i++) {
        if (qf !== null && i !== qf) continue;
        for (var j = reg[2]; j < reg[3]; j++) {
          if (kf !== null && j !== kf) continue;
          var v = w(l, h, i, j);
          if (v < 0.01) continue;
          paths[Math.min(BUCKETS - 1, Math.floor(v * BUCKETS))].push(i, j);
        }
      }
      for (var bb = 0; bb < BUCKETS; bb++) {
        var p = paths[bb];
        if (!p.length) continue;
        ctx.strokeStyle = headColor(h, ((bb + 0.5) / BUCKETS).toFixed(3));
        ctx.beginPath();
        for (var s = 0; s < p.length; s += 2) {
          ctx.moveTo(0, p[s] * ROW + ROW / 2);
          ctx.lineTo(linesW, p[s + 1] * ROW + ROW / 2);
        }
        ctx.stroke();
      }
    }
    var qs = $("q-col").children, ks = $("k-col").children, n = heads.length;
    for (var a = 0; a < qs.length; a++) {
      var shadeQ = 0;
      if (kf !== null && n) { for (var u = 0; u < n; u++) shadeQ += w(l, heads[u], a, kf); shadeQ /= n; }
      qs[a].style.background = shadeQ > 0 ? "rgba(47, 95, 208, " + shadeQ.toFixed(3) + ")" : "";
      qs[a].classList.toggle("active", a === qf);
      qs[a].classList.toggle("dim", a < reg[0] || a >= reg[1]);
    }
    for (var c2 = 0; c2 < ks.length; c2++) {
      var shadeK = 0;
      if (qf !== null && n) { for (var u2 = 0; u2 < n; u2++) shadeK += w(l, heads[u2], qf, c2); shadeK /= n; }
      ks[c2].style.background = shadeK > 0 ? "rgba(47, 95, 208, " + shadeK.toFixed(3) + ")" : "";
      ks[c2].classList.toggle("active", c2 === kf);
      ks[c2].classList.toggle("dim", c2 < reg[2] || c2 >= reg[3]);
    }
  }

  // ---- matrix view: one canvas pixel per (query, key), scaled up by CSS
  var matrix = $("matrix"), current = null;
  function labelStrip(box, labels, from, to, cell, horizontal) {
    clear(box);
    var n = to - from, step = Math.max(1, Math.ceil(12 / cell)), longest = 0;
    for (var i = from; i < to; i++) longest = Math.max(longest, labels[i].length);
    var extent = Math.min(130, 12 + 7 * longest);
    if (horizontal) { box.style.width = n * cell + "px"; box.style.height = extent + "px"; }
    else { box.style.height = n * cell + "px"; box.style.width = extent + "px"; }
    box.style.position = "sticky";
    for (var t = 0; t < n; t += step) {
      var s = el("span", "", labels[from + t]);
      s.dataset.index = String(from + t);
      s.title = labels[from + t];
      var center = Math.max(0, (t + 0.5) * cell - 7);
      if (horizontal) { s.style.left = center + "px"; } else { s.style.top = center + "px"; }
      box.appendChild(s);
    }
    return step;
  }
  function drawMatrix() {
    var reg = region(), heads = selectedHeads(), rows = reg[1] - reg[0], cols = reg[3] - reg[2];
    var cell = state.zoom;
    var m = heads.length ? meanMatrix(state.layer, heads, reg) : new Float32Array(rows * cols);
    var vmax = maxOf(m);
    current = { reg: reg, m: m, cols: cols, rows: rows, cell: cell, heads: heads };
    matrix.width = cols; matrix.height = rows;
    matrix.style.width = cols * cell + "px"; matrix.style.height = rows * cell + "px";
    var ctx = matrix.getContext("2d"), img = ctx.createImageData(cols, rows), px = img.data;
    for (var p = 0; p < m.length; p++) {
      var ci = Math.round(255 * toUnit(m[p], vmax, state.scale)) * 3;
      px[4 * p] = LUT[ci]; px[4 * p + 1] = LUT[ci + 1]; px[4 * p + 2] = LUT[ci + 2]; px[4 * p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    labelStrip($("x-labels"), S.keyTokens, reg[2], reg[3], cell, true);
    labelStrip($("y-labels"), S.tokens, reg[0], reg[1], cell, false);
    // Dividers at the sentence-pair separator, when it falls inside the shown region.
    var box = $("matrix-box");
    Array.prototype.slice.call(box.querySelectorAll(".divider-line")).forEach(function (d) { d.remove(); });
    if (S.pairStart !== null) {
      if (S.pairStart > reg[0] && S.pairStart < reg[1]) {
        var hl = el("div", "divider-line"); hl.style.left = "0"; hl.style.width = cols * cell + "px";
        hl.style.top = ((S.pairStart - reg[0]) * cell - 1) + "px"; hl.style.height = "2px"; box.appendChild(hl);
      }
      if (S.pairKeyStart > reg[2] && S.pairKeyStart < reg[3]) {
        var vl = el("div", "divider-line"); vl.style.top = "0"; vl.style.height = rows * cell + "px";
        vl.style.left = ((S.pairKeyStart - reg[2]) * cell - 1) + "px"; vl.style.width = "2px"; box.appendChild(vl);
      }
    }
    $("cell-mark").hidden = true;
    drawColorbar(vmax);
    $("zoom").value = String(cell);
    $("zoom-text").textContent = cell + " px per token";
  }
  function drawColorbar(vmax) {
    var bar = $("bar"), ctx = bar.getContext("2d"), img = ctx.createImageData(1, 256);
    for (var y = 0; y < 256; y++) {
      var ci = (255 - y) * 3;
      img.data[4 * y] = LUT[ci]; img.data[4 * y + 1] = LUT[ci + 1]; img.data[4 * y + 2] = LUT[ci + 2];
      img.data[4 * y + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    $("bar-max").textContent = fmt(vmax);
    $("bar-min").textContent = state.scale === "log" ? "\u2264 " + fmt(vmax * LOG_FLOOR) : "0";
    $("bar-name").textContent = state.scale + " scale";
  }
  function markLabels(box, index) {
    var spans = box.children;
    for (var s = 0; s < spans.length; s++) spans[s].classList.toggle("hi", +spans[s].dataset.index === index);
  }
  matrix.addEventListener("mousemove", function (ev) {
    if (!current) return;
    var r = matrix.getBoundingClientRect(), cell = current.cell;
    var j = Math.floor((ev.clientX - r.left) / cell), i = Math.floor((ev.clientY - r.top) / cell);
    var tip = $("tooltip"), mark = $("cell-mark");
    if (i < 0 || j < 0 || i >= current.rows || j >= current.cols) { tip.hidden = true; mark.hidden = true; return; }
    var qi = current.reg[0] + i, kj = current.reg[2] + j, n = current.heads.length;
    tip.textContent = "#" + qi + " " + S.tokens[qi] + " \u2192 #" + kj + " " + S.keyTokens[kj] + "   " +
      fmt(current.m[i * current.cols + j]) + (n === 1 ? "" : "  (mean of " + n + " heads)");
    tip.style.left = (ev.clientX + 14) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
    tip.hidden = false;
    mark.style.left = (j * cell) + "px"; mark.style.top = (i * cell) + "px";
    mark.style.width = Math.max(cell, 3) + "px"; mark.style.height = Math.max(cell, 3) + "px";
    mark.hidden = false;
    markLabels($("x-labels"), kj);
    markLabels($("y-labels"), qi);
  });
  matrix.addEventListener("mouseleave", function () {
    $("tooltip").hidden = true; $("cell-mark").hidden = true;
  });
  function setZoom(z) { state.zoom = Math.max(1, Math.min(40, Math.round(z))); render(); }
  $("zoom").addEventListener("input", function () { setZoom(+$("zoom").value); });
  $("zoom-in").addEventListener("click", function () { setZoom(state.zoom + Math.max(1, state.zoom / 4)); });
  $("zoom-out").addEventListener("click", function () { setZoom(state.zoom - Math.max(1, state.zoom / 5)); });
  $("matrix-scroll").addEventListener("wheel", function (ev) {
    if (!ev.ctrlKey) return;
    ev.preventDefault();
    setZoom(state.zoom * (ev.deltaY < 0 ? 1.25 : 0.8));
  }, { passive: false });

  // ---- model view: every layer x head as a thumbnail
  var thumbsBuilt = false, thumbs = [];
  function buildThumbs() {
    var box = $("thumbs"), side = Math.max(40, Math.min(96, Math.floor(1100 / nH) - 8));
    clear(box); thumbs = [];
    box.style.gridTemplateColumns = "auto repeat(" + nH + ", " + side + "px)";
    box.appendChild(el("span", "col-label", ""));
    for (var h = 0; h < nH; h++) box.appendChild(el("span", "col-label", S.heads[h]));
    for (var l = 0; l < nL; l++) {
      box.appendChild(el("span", "row-label", S.layers[l]));
      for (var h2 = 0; h2 < nH; h2++) {
        var cv = el("canvas");
        cv.style.width = side + "px"; cv.style.height = side + "px";
        cv.title = S.layers[l] + ", " + S.heads[h2] + ": click to open";
        cv.dataset.layer = String(l); cv.dataset.head = String(h2);
        cv.addEventListener("click", openThumb);
        box.appendChild(cv);
        thumbs.push(cv);
      }
    }
    thumbsBuilt = true;
  }
  function openThumb(ev) {
    var cv = ev.currentTarget, h = +cv.dataset.head;
    state.layer = +cv.dataset.layer;
    for (var t = 0; t < nH; t++) state.heads[t] = t === h;
    state.view = state.openIn;
    render();
  }
  function drawThumbs() {
    if (!thumbsBuilt) buildThumbs();
    var reg = region(), rows = reg[1] - reg[0], cols = reg[3] - reg[2];
    var f = Math.max(1, Math.ceil(Math.max(rows, cols) / 96));   // max-pool f x f tokens
    var tr = Math.ceil(rows / f), tc = Math.ceil(cols / f);
    thumbs.forEach(function (cv) {
      var l = +cv.dataset.layer, h = +cv.dataset.head, base = (l * nH + h) * Q * K;
      var pooled = new Uint8Array(tr * tc), vmax = 0;
      for (var i = 0; i < rows; i++) {
        var src = base + (reg[0] + i) * K + reg[2], dst = Math.floor(i / f) * tc;
        for (var j = 0; j < cols; j++) {
          var b = S.bytes[src + j], at = dst + Math.floor(j / f);
          if (b > pooled[at]) pooled[at] = b;
          if (b > vmax) vmax = b;
        }
      }
      cv.width = tc; cv.height = tr;
      var ctx = cv.getContext("2d"), img = ctx.createImageData(tc, tr), px = img.data;
      for (var p = 0; p < pooled.length; p++) {
        var ci = Math.round(255 * toUnit(pooled[p], vmax, state.scale)) * 3;
        px[4 * p] = LUT[ci]; px[4 * p + 1] = LUT[ci + 1]; px[4 * p + 2] = LUT[ci + 2]; px[4 * p + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
    });
  }

  // ---- controls
  $("set").addEventListener("change", function () { state.set = +$("set").value; setupSet(); render(); });
  $("layer").addEventListener("change", function () { state.layer = +$("layer").value; render(); });
  ["head", "matrix", "model"].forEach(function (v) {
    $("view-" + v).addEventListener("click", function () { state.view = v; render(); });
  });
  $("all-heads").addEventListener("click", function () {
    for (var t = 0; t < nH; t++) state.heads[t] = true; render();
  });
  $("one-head").addEventListener("click", function () {
    for (var t = 0; t < nH; t++) state.heads[t] = t === 0; render();
  });
  $("scale").addEventListener("change", function () { state.scale = $("scale").value; render(); });
  $("open-in").addEventListener("change", function () { state.openIn = $("open-in").value; });

  // ---- state <-> address
  function readHash() {
    var parts = (location.hash || "").replace(/^#/, "").split("&"), want = {};
    parts.forEach(function (p) {
      var kv = p.split("=");
      if (kv[0]) want[kv[0]] = decodeURIComponent(kv[1] || "");
    });
    if (/^\d+$/.test(want.set || "") && +want.set < D.sets.length) state.set = +want.set;
    setupSet();
    if (Q * K > LONG) state.view = "matrix";
    if (["head", "matrix", "model"].indexOf(want.view) >= 0) state.view = want.view;
    if (/^\d+$/.test(want.layer || "") && +want.layer < nL) state.layer = +want.layer;
    if (want.heads) {
      var hs = want.heads.split(",").filter(function (x) { return /^\d+$/.test(x) && +x < nH; });
      if (hs.length) for (var t = 0; t < nH; t++) state.heads[t] = hs.indexOf(String(t)) >= 0;
    }
    if (/^\d+$/.test(want.token || "") && +want.token < Q) state.qFocus = +want.token;
    if (["linear", "power", "log"].indexOf(want.scale) >= 0) state.scale = want.scale;
    if (S.pairStart !== null && ["all", "AA", "AB", "BA", "BB"].indexOf(want.filter) >= 0) state.filter = want.filter;
    if (/^\d+$/.test(want.zoom || "")) state.zoom = Math.max(1, Math.min(40, +want.zoom));
    if (want.open === "head" || want.open === "matrix") state.openIn = want.open;
  }

  function render() {
    var t0 = performance.now();
    $("set").value = String(state.set);
    $("layer").value = String(state.layer);
    $("scale").value = state.scale;
    $("open-in").value = state.openIn;
    var hs = $("heads").children;
    for (var h = 0; h < hs.length; h++) hs[h].setAttribute("aria-pressed", String(state.heads[h]));
    var fs = $("pair").children;
    for (var f = 0; f < fs.length; f++) fs[f].setAttribute("aria-pressed", String(fs[f].dataset.filter === state.filter));
    ["head", "matrix", "model"].forEach(function (v) {
      $("view-" + v).setAttribute("aria-pressed", String(state.view === v));
      $(v + "-view").hidden = state.view !== v;
    });
    $("zoom-box").hidden = state.view !== "matrix";
    $("open-box").hidden = state.view !== "model";
    var n = selectedHeads().length;
    var hints = {
      head: "Hover a token to see where it attends (left: queries) or what attends to it (right: keys). " +
        "Line opacity = weight; one color per head. Click a head to show it alone, shift-click to add it." +
        (Q * K > LONG ? " Long input: until you hover a token, each query shows one line, to its strongest key (mean of the heads)." : ""),
      matrix: "Weights of " + (n === 1 ? "head " + selectedHeads()[0] : "the mean of " + n + " heads") +
        "; rows are queries, columns keys. Hover a cell for its value; zoom with the slider or ctrl + wheel.",
      model: "Every layer (rows) and head (columns), each on its own colour range. Click one to open it."
    };
    $("hint").textContent = hints[state.view];
    if (state.view === "head") drawHeadView();
    else if (state.view === "matrix") drawMatrix();
    else drawThumbs();
    document.body.dataset.renderMs = (performance.now() - t0).toFixed(0);
  }

  try {
    header();
    Promise.all(D.sets.map(decode)).then(function () {
      readHash();
      render();
      document.body.dataset.readyMs = performance.now().toFixed(0);  // since navigation start
      document.body.dataset.ready = "1";
    }).catch(function (e) { fail(String(e && e.message ? e.message : e)); });
  } catch (e) {
    fail(String(e && e.message ? e.message : e));
    throw e;
  }
})();
