"use strict";
// attnkit's attention viewer, part 1: the data, colours and small helpers.
var AK = (function () {
  var $ = function (id) { return document.getElementById(id); };
  function fail(message) {
    var box = $("error");
    box.textContent = "This page could not draw the attention: " + message;
    box.hidden = false;
  }
  window.addEventListener("error", function (ev) { fail(String(ev.message)); });
  var D = JSON.parse($("attention-data").textContent);

  // ---- bytes: base64, deflate
  function bytesOf(text) {
    var bin = atob(text), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function unpack(part) {
    var raw = bytesOf(part.data);
    if (part.encoding !== "deflate") return Promise.resolve(raw);
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser cannot decompress the data (no DecompressionStream)"));
    }
    var stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (b) { return new Uint8Array(b); });
  }
  // The neuron view's q or k, (layers, heads, n, d) signed bytes, each times the scale of
  // its (layer, head, dimension).
  function signedToFloat(bytes, scales, d) {
    var codes = new Int8Array(bytes.buffer, bytes.byteOffset, bytes.length);
    var out = new Float32Array(codes.length), groups = scales.length / d;
    var block = groups ? codes.length / groups : 0;
    if (codes.length && block !== Math.floor(block)) throw new Error("q or k has the wrong size");
    for (var i = 0; i < codes.length; i++) {
      out[i] = codes[i] * scales[Math.floor(i / block) * d + (i % d)];
    }
    return out;
  }
  // A grid (layers, heads, Q, K): every weight ("dense"), or block overview + top-k rows ("long").
  function decodeGrid(g, shape) {
    var nL = shape[0], nH = shape[1], Q = shape[2], K = shape[3];
    g.nL = nL; g.nH = nH; g.Q = Q; g.K = K;
    if (g.mode === "dense") {
      g.scaleOf = new Float32Array(g.scales);
      return unpack(g).then(function (w) {
        if (w.length !== nL * nH * Q * K) throw new Error("expected " + nL * nH * Q * K + " weights, got " + w.length);
        g.bytes = w; return g;
      });
    }
    var t = g.topk;
    return Promise.all([unpack(g.pooledMax), unpack(g.pooledMean), unpack(t.index), unpack(t.weight)])
      .then(function (parts) {
        g.pmax = parts[0]; g.pmaxScale = new Float32Array(g.pooledMax.scales);
        g.pmean = parts[1]; g.pmeanScale = new Float32Array(g.pooledMean.scales);
        var gaps = t.indexBytes === 2 ? new Uint16Array(parts[2].buffer, parts[2].byteOffset, parts[2].length / 2)
          : new Uint32Array(parts[2].buffer, parts[2].byteOffset, parts[2].length / 4);
        var k = t.k, idx = new Uint32Array(gaps.length);
        for (var r = 0; r < gaps.length; r += k) {
          var acc = 0;
          for (var c = 0; c < k; c++) { acc += gaps[r + c]; idx[r + c] = acc; }
        }
        g.k = k; g.tkIdx = idx; g.tkW = parts[3]; g.tkScale = new Float32Array(t.weight.scales);
        g.Qb = g.pooledShape[2]; g.Kb = g.pooledShape[3];
        return g;
      });
  }
  function decodeSet(set) {
    var jobs = [decodeGrid(set, set.shape)];
    ["rollout", "flow"].forEach(function (name) {
      if (set[name]) jobs.push(decodeGrid(set[name], [1, 1, set.shape[2], set.shape[3]]));
    });
    if (set.neuron) {
      jobs.push(Promise.all([unpack(set.neuron.q), unpack(set.neuron.k)]).then(function (p) {
        set.neuron.qv = signedToFloat(p[0], set.neuron.q.scales, set.neuron.dim);
        set.neuron.kv = signedToFloat(p[1], set.neuron.k.scales, set.neuron.dim);
      }));
    }
    return Promise.all(jobs).then(function () { return set; });
  }
  // A comparison's A - B (made in Python): every weight ("dense") or block means ("blocks"),
  // one signed byte each against each head's largest |A - B|.
  function decodeDiff(d) {
    if (!d) return Promise.resolve(null);
    d.nL = d.shape[0]; d.nH = d.shape[1]; d.R = d.shape[2]; d.C = d.shape[3];
    d.scaleOf = new Float32Array(d.scales);
    return unpack(d).then(function (b) {
      d.codes = new Int8Array(b.buffer, b.byteOffset, b.length);
      if (d.codes.length !== d.nL * d.nH * d.R * d.C) throw new Error("the difference has the wrong size");
      return d.rollout ? decodeDiff(d.rollout) : null;
    }).then(function () { return d; });
  }
  // Row i of A - B, the mean over `heads` (a mean of differences is the difference of means).
  function diffRow(d, l, heads, i) {
    var C = d.C, out = new Float32Array(C);
    heads.forEach(function (h) {
      var base = ((l * d.nH + h) * d.R + i) * C, sc = d.scaleOf[l * d.nH + h] / 127 / heads.length;
      for (var j = 0; j < C; j++) out[j] += d.codes[base + j] * sc;
    });
    return out;
  }

  // ---- weights: one row (exact on dense pages; top-k exact, the rest unknown, on long ones)
  // row(g, l, h, i) -> {w: Float32Array(K), known: Uint8Array(K) or null (all known), floor}
  function row(g, l, h, i) {
    var K = g.K, w = new Float32Array(K);
    if (g.mode === "dense") {
      var base = ((l * g.nH + h) * g.Q + i) * K, sc = g.scaleOf[l * g.nH + h] / 255;
      for (var j = 0; j < K; j++) w[j] = g.bytes[base + j] * sc;
      return { w: w, known: null, floor: 0 };
    }
    var known = new Uint8Array(K), k = g.k, at = ((l * g.nH + h) * g.Q + i) * k;
    var s = g.tkScale[l * g.nH + h] / 255, floor = Infinity;
    for (var c = 0; c < k; c++) {
      var v = g.tkW[at + c] * s; w[g.tkIdx[at + c]] = v; known[g.tkIdx[at + c]] = 1;
      if (v < floor) floor = v;
    }
    return { w: w, known: known, floor: floor === Infinity ? 0 : floor };
  }
  // Mean (or sum) over heads and over selected rows.
  function combine(g, l, heads, rows, how) {
    var K = g.K, out = new Float32Array(K), known = g.mode === "dense" ? null : new Uint8Array(K), floor = 0;
    var n = heads.length * rows.length;
    heads.forEach(function (h) {
      rows.forEach(function (i) {
        var r = row(g, l, h, i);
        for (var j = 0; j < K; j++) out[j] += r.w[j];
        if (known) { for (var j2 = 0; j2 < K; j2++) known[j2] |= r.known[j2]; floor = Math.max(floor, r.floor); }
      });
    });
    var div = how === "sum" ? heads.length : n;
    if (div) for (var j3 = 0; j3 < K; j3++) out[j3] /= div;
    return { w: out, known: known, floor: floor };
  }
  // Column of keys: what queries give to key j (dense only exact; long: from top-k entries).
  function column(g, l, heads, cols, how) {
    var Q = g.Q, out = new Float32Array(Q);
    heads.forEach(function (h) {
      for (var i = 0; i < Q; i++) {
        if (g.mode === "dense") {
          var base = ((l * g.nH + h) * Q + i) * g.K, sc = g.scaleOf[l * g.nH + h] / 255;
          cols.forEach(function (j) { out[i] += g.bytes[base + j] * sc; });
        } else {
          var k = g.k, at = ((l * g.nH + h) * Q + i) * k, s = g.tkScale[l * g.nH + h] / 255;
          for (var c = 0; c < k; c++) if (cols.indexOf(g.tkIdx[at + c]) >= 0) out[i] += g.tkW[at + c] * s;
        }
      }
    });
    var div = heads.length * (how === "sum" ? 1 : cols.length);
    if (div) for (var i2 = 0; i2 < Q; i2++) out[i2] /= div;
    return out;
  }
  function pooled(g, l, heads, kind) {
    var n = g.Qb * g.Kb, out = new Float32Array(n);
    var src = kind === "mean" ? g.pmean : g.pmax, scale = kind === "mean" ? g.pmeanScale : g.pmaxScale;
    heads.forEach(function (h) {
      var base = (l * g.nH + h) * n, sc = scale[l * g.nH + h] / 255;
      for (var p = 0; p < n; p++) {
        var v = src[base + p] * sc;
        if (kind === "mean") out[p] += v / heads.length; else if (v > out[p]) out[p] = v;
      }
    });
    return out;
  }

  // ---- colours: white-to-blue on light pages, dark-to-light blue on dark ones
  var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  var RAMP = dark ? [[20, 23, 29], [27, 52, 110], [47, 95, 208], [127, 166, 240], [230, 238, 255]]
    : [[255, 255, 255], [212, 226, 247], [127, 166, 224], [47, 95, 208], [13, 36, 99]];
  var LUT = new Uint8Array(256 * 3);
  for (var c = 0; c < 256; c++) {
    var x = c / 255 * (RAMP.length - 1), k0 = Math.min(RAMP.length - 2, Math.floor(x)), f = x - k0;
    for (var ch = 0; ch < 3; ch++) LUT[3 * c + ch] = Math.round(RAMP[k0][ch] * (1 - f) + RAMP[k0 + 1][ch] * f);
  }
  // Differences: blue where B is higher, orange where A is, the page's background at 0.
  var SIGNED = dark ? [[97, 150, 255], [20, 23, 29], [255, 138, 76]] : [[33, 86, 196], [255, 255, 255], [194, 65, 12]];
  var DLUT = new Uint8Array(256 * 3);
  for (var c2 = 0; c2 < 256; c2++) {
    var x2 = c2 / 255 * 2, k2 = Math.min(1, Math.floor(x2)), f2 = x2 - k2;
    for (var ch2 = 0; ch2 < 3; ch2++) DLUT[3 * c2 + ch2] = Math.round(SIGNED[k2][ch2] * (1 - f2) + SIGNED[k2 + 1][ch2] * f2);
  }
  var LOG_FLOOR = 1e-3;
  function toUnit(v, vmax, scale) {
    if (!(vmax > 0) || !(v > 0)) return 0;
    var t = v / vmax;
    if (scale === "power") return Math.sqrt(Math.min(1, t));
    if (scale === "log") return t <= LOG_FLOOR ? 0 : Math.min(1, 1 - Math.log(t) / Math.log(LOG_FLOOR));
    return Math.min(1, t);
  }
  function shade(v, vmax) {  // a token's background for weight v
    var a = vmax > 0 ? Math.min(1, v / vmax) : 0;
    return a > 0.005 ? (dark ? "rgba(109, 149, 255, " : "rgba(47, 95, 208, ") + (0.85 * a).toFixed(3) + ")" : "";
  }
  function paint(px, p, unit) {
    var ci = Math.round(255 * unit) * 3;
    px[4 * p] = LUT[ci]; px[4 * p + 1] = LUT[ci + 1]; px[4 * p + 2] = LUT[ci + 2]; px[4 * p + 3] = 255;
  }
  function paintSigned(px, p, t) {  // t in [-1, 1]
    var ci = Math.round(127.5 + 127.5 * Math.max(-1, Math.min(1, t))) * 3;
    px[4 * p] = DLUT[ci]; px[4 * p + 1] = DLUT[ci + 1]; px[4 * p + 2] = DLUT[ci + 2]; px[4 * p + 3] = 255;
  }
  function toSigned(v, vmax, scale) { return v < 0 ? -toUnit(-v, vmax, scale) : toUnit(v, vmax, scale); }
  function fmt(v) {
    if (v === 0) return "0";
    if (v < 0) return "\u2212" + fmt(-v);
    return v >= 0.01 ? v.toFixed(3) : v.toExponential(1);
  }
  function ordinal(n) {  // 2 -> "2nd"
    var t = n % 100, u = n % 10;
    return n + (u === 1 && t !== 11 ? "st" : u === 2 && t !== 12 ? "nd" : u === 3 && t !== 13 ? "rd" : "th");
  }
  function maxOf(a) { var m = 0; for (var i = 0; i < a.length; i++) if (a[i] > m) m = a[i]; return m; }
  function absMaxOf(a) { var m = 0; for (var i = 0; i < a.length; i++) if (Math.abs(a[i]) > m) m = Math.abs(a[i]); return m; }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  // A token as shown: a leading space as a faint middle dot, newlines as a return arrow.
  function tokenNode(tag, cls, text) {
    var e = el(tag, cls);
    var m = /^ /.test(text);
    if (m) { e.appendChild(el("span", "ws", "\u00b7")); text = text.slice(1); }
    e.appendChild(document.createTextNode(text.replace(/\r?\n/g, "\u21b5").replace(/\t/g, "\u2192")));
    return e;
  }
  function plain(text) {
    return text.replace(/^ /, "\u00b7").replace(/\r?\n/g, "\u21b5").replace(/\t/g, "\u2192");
  }

  return { $: $, D: D, fail: fail, unpack: unpack, decodeSet: decodeSet, decodeDiff: decodeDiff, diffRow: diffRow, row: row,
           combine: combine, column: column, pooled: pooled, LUT: LUT, DLUT: DLUT, toUnit: toUnit,
           toSigned: toSigned, shade: shade, paint: paint, paintSigned: paintSigned, fmt: fmt, maxOf: maxOf,
           absMaxOf: absMaxOf, ordinal: ordinal, el: el, clear: clear, tokenNode: tokenNode, plain: plain, dark: dark,
           LOG_FLOOR: LOG_FLOOR, LONG: 96 * 96, views: {} };
})();
