"use strict";
// attnkit's attention viewer, part 4 of 5: model, statistics and neuron views, the selection
// strip, the generation panel, and saving the view as SVG or PNG.
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state;

  // ---- model view: every layer x head as a thumbnail (block max on long pages)
  var thumbs = [], thumbsKey = null;
  function drawModel() {
    var S = AK.S(), nL = S.shape[0], nH = S.shape[1], box = $("thumbs");
    if (thumbsKey !== state.set) {
      thumbsKey = state.set;
      var side = Math.max(40, Math.min(96, Math.floor(1100 / nH) - 8));
      clear(box); thumbs = [];
      box.style.gridTemplateColumns = "auto repeat(" + nH + ", " + side + "px)";
      box.appendChild(el("span", "col-label", ""));
      for (var h = 0; h < nH; h++) box.appendChild(el("span", "col-label", S.heads[h]));
      for (var l = 0; l < nL; l++) {
        box.appendChild(el("span", "row-label", S.layers[l]));
        for (var h2 = 0; h2 < nH; h2++) {
          var cv = el("canvas");
          cv.style.width = side + "px"; cv.style.height = side + "px"; cv.tabIndex = 0;
          cv.title = S.layers[l] + ", " + S.heads[h2] + ": " + S.stats["class"][l][h2] + "; click to open";
          cv.setAttribute("role", "button");
          cv.dataset.layer = String(l); cv.dataset.head = String(h2);
          cv.addEventListener("click", openThumb);
          cv.addEventListener("keydown", function (ev) { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); openThumb(ev); } });
          box.appendChild(cv); thumbs.push(cv);
        }
      }
    }
    var reg = AK.region();
    thumbs.forEach(function (cv) {
      var img = thumbImage(S, +cv.dataset.layer, +cv.dataset.head, reg);
      cv.width = img.width; cv.height = img.height;
      cv.getContext("2d").putImageData(img, 0, 0);
    });
  }
  function thumbImage(S, l, h, reg) {
    var rows = reg[1] - reg[0], cols = reg[3] - reg[2], vals, tr, tc;
    if (S.mode === "long") {
      var b = S.block, r0 = Math.floor(reg[0] / b), c0 = Math.floor(reg[2] / b);
      tr = Math.ceil(reg[1] / b) - r0; tc = Math.ceil(reg[3] / b) - c0;
      var p = AK.pooled(S, l, [h], "max");
      vals = new Float32Array(tr * tc);
      for (var i = 0; i < tr; i++) for (var j = 0; j < tc; j++) vals[i * tc + j] = p[(r0 + i) * S.Kb + c0 + j];
    } else {
      var f = Math.max(1, Math.ceil(Math.max(rows, cols) / 96));
      tr = Math.ceil(rows / f); tc = Math.ceil(cols / f); vals = new Float32Array(tr * tc);
      var base = (l * S.nH + h) * S.Q * S.K;
      for (var i2 = 0; i2 < rows; i2++) {
        var src = base + (reg[0] + i2) * S.K + reg[2], dst = Math.floor(i2 / f) * tc;
        for (var j2 = 0; j2 < cols; j2++) {
          var v = S.bytes[src + j2], at = dst + Math.floor(j2 / f);
          if (v > vals[at]) vals[at] = v;
        }
      }
    }
    var vmax = AK.maxOf(vals), img = new ImageData(tc, tr);
    for (var q = 0; q < vals.length; q++) AK.paint(img.data, q, AK.toUnit(vals[q], vmax, state.scale));
    return img;
  }
  function openThumb(ev) {
    var cv = ev.currentTarget;
    AK.openHead(+cv.dataset.layer, +cv.dataset.head, state.openIn);
  }

  // ---- statistics: a sortable table; a row opens its head
  var COLS = [["layer", "layer"], ["head", "head"], ["class", "pattern"], ["score", "score"],
              ["entropy", "entropy (nats)"], ["normEntropy", "normalized entropy"], ["distance", "mean distance"],
              ["prev", "previous"], ["first", "first / sink"], ["self", "self"], ["local", "local \u00b14"]];
  function drawStats() {
    var S = AK.S(), st = S.stats, nL = S.shape[0], nH = S.shape[1];
    var cols = COLS.filter(function (c) { return c[0] === "layer" || c[0] === "head" || st[c[0]] !== undefined; });
    var rows = [];
    for (var l = 0; l < nL; l++) for (var h = 0; h < nH; h++) {
      var r = { layer: l, head: h };
      cols.forEach(function (c) { if (st[c[0]] !== undefined) r[c[0]] = st[c[0]][l][h]; });
      rows.push(r);
    }
    var key = state.sort.key;
    if (key) rows.sort(function (a, b) { return (a[key] < b[key] ? -1 : a[key] > b[key] ? 1 : 0) * state.sort.dir; });
    var head = $("stats").tHead, body = $("stats").tBodies[0];
    clear(head); clear(body);
    var tr = el("tr");
    cols.forEach(function (c) {
      var th = el("th", "", c[1]);
      th.dataset.key = c[0]; th.tabIndex = 0;
      if (key === c[0]) th.setAttribute("aria-sort", state.sort.dir > 0 ? "ascending" : "descending");
      th.addEventListener("click", sortBy); th.addEventListener("keydown", function (ev) { if (ev.key === "Enter") sortBy(ev); });
      tr.appendChild(th);
    });
    head.appendChild(tr);
    rows.forEach(function (r) {
      var row = el("tr");
      row.tabIndex = 0;
      cols.forEach(function (c) {
        var v = c[0] === "layer" ? S.layers[r.layer] : c[0] === "head" ? S.heads[r.head] : r[c[0]];
        row.appendChild(el("td", c[0] === "class" ? "cls" : "", typeof v === "number" ? v.toFixed(3) : String(v)));
      });
      var open = function () { AK.openHead(r.layer, r.head, "matrix"); };
      row.addEventListener("click", open);
      row.addEventListener("keydown", function (ev) { if (ev.key === "Enter") open(); });
      body.appendChild(row);
    });
  }
  function sortBy(ev) {
    var k = ev.currentTarget.dataset.key;
    state.sort = { key: k, dir: state.sort.key === k ? -state.sort.dir : 1 };
    drawStats();
  }

  // ---- neuron view: q, k and the terms whose sum (times the scale) is the logit
  function options(select, tokens, n, chosen) {
    if (select.options.length !== n) {
      clear(select);
      for (var i = 0; i < n; i++) { var o = el("option", "", "#" + i + " " + AK.plain(tokens[i])); o.value = String(i); select.appendChild(o); }
    }
    select.value = String(chosen);
  }
  function drawNeuron() {
    var S = AK.S(), N = S.neuron, box = $("neuron");
    clear(box);
    var li = N ? N.layers.indexOf(state.layer) : -1;
    if (li < 0) { box.appendChild(el("p", "muted", "q and k are not kept for this layer (see the notes above).")); return; }
    var h = AK.heads()[0] === undefined ? 0 : AK.heads()[0], d = N.dim, Q = S.shape[2], K = S.shape[3], nH = S.shape[1];
    var qi = state.nq !== null ? state.nq : (state.sel.axis === "q" && state.sel.items.length ? state.sel.items[0] : Q - 1);
    var kj = state.nk !== null ? state.nk : AK.argmax(AK.row(S, state.layer, h, qi).w);
    // q is kept for page queries queryStart .. queryStop - 1, k for the keys in keyIndex (null: all)
    var q0 = N.queryStart || 0, nq = (N.queryStop === undefined ? Q : N.queryStop) - q0;
    var keys = N.keyIndex || null, nk = keys ? keys.length : K;
    if (keys && state.nk === null && keys.indexOf(kj) < 0) {
      var wr = AK.row(S, state.layer, h, qi).w;
      kj = keys.reduce(function (b, j) { return wr[j] > wr[b] ? j : b; }, keys[0]);
    }
    options($("n-query"), S.tokens, Q, qi); options($("n-key"), S.keyTokens, K, kj);
    $("n-head").textContent = S.layers[state.layer] + ", " + S.heads[h] + " (the first chosen head)";
    var qr = qi - q0, kr = keys ? keys.indexOf(kj) : kj;
    if (qr < 0 || qr >= nq || kr < 0) {
      box.appendChild(el("p", "muted", "q and k are kept for queries #" + q0 + " to #" + (q0 + nq - 1) +
        (keys ? " and " + nk + " keys" : "") + " (see the notes above): choose one of them."));
      return;
    }
    var q = N.qv.subarray(((li * nH + h) * nq + qr) * d, ((li * nH + h) * nq + qr + 1) * d);
    var k = N.kv.subarray(((li * nH + h) * nk + kr) * d, ((li * nH + h) * nk + kr + 1) * d);
    var form = N.forms[li] || { terms: "dot", scale: 1 }, terms = new Float32Array(d), sum = 0;
    for (var e = 0; e < d; e++) {
      terms[e] = form.terms === "additive" ? Math.tanh(q[e] + k[e]) * form.wv[e]
        : form.terms === "gaussian" ? -(q[e] - k[e]) * (q[e] - k[e]) * form.inv2var : q[e] * k[e];
      sum += terms[e];
    }
    var names = { dot: ["q", "k", "q\u2099\u00b7k\u2099"], gaussian: ["q", "k", "\u2212(q\u2099\u2212k\u2099)\u00b2/2\u03c3\u00b2"],
                  additive: ["W_q q", "W_k k", "tanh(W_q q + W_k k)\u2099\u00b7w_v\u2099"] }[form.terms];
    [[names[0], q], [names[1], k], [names[2] + " (per dimension)", terms]].forEach(function (pair) {
      box.appendChild(el("div", "", pair[0]));
      box.appendChild(bars(pair[1]));
    });
    var order = Array.prototype.slice.call(terms).map(function (v, i) { return [v, i]; })
      .sort(function (a, b) { return Math.abs(b[0]) - Math.abs(a[0]); }).slice(0, 8);
    box.appendChild(el("p", "sum", "logit term = " + form.scale.toPrecision(4) + " \u00d7 " + sum.toFixed(4) + " = " +
      (form.scale * sum).toFixed(4) + ";  weight " + AK.fmt(AK.row(S, state.layer, h, qi).w[kj]) +
      (form.terms === "dot" ? "  (a model's position bias or mask, if any, adds to the logit)" : "")));
    box.appendChild(el("p", "muted", "dimensions that dominate: " + order.map(function (o) {
      return "d" + o[1] + " " + (o[0] >= 0 ? "+" : "") + o[0].toFixed(3);
    }).join(",  ")));
  }
  function bars(v) {
    var cv = el("canvas"), w = Math.max(2, Math.min(12, Math.floor(720 / v.length))), hgt = 60;
    cv.width = v.length * w; cv.height = hgt;
    var ctx = cv.getContext("2d"), m = 0;
    for (var i = 0; i < v.length; i++) m = Math.max(m, Math.abs(v[i]));
    for (var j = 0; j < v.length; j++) {
      var y = m ? v[j] / m * (hgt / 2 - 2) : 0;
      ctx.fillStyle = v[j] >= 0 ? "#2f5fd0" : "#c2410c";
      ctx.fillRect(j * w, hgt / 2 - Math.max(0, y), w - 1, Math.abs(y));
    }
    return cv;
  }
  $("n-query").addEventListener("change", function () { state.nq = +$("n-query").value; state.nk = null; AK.render(); });
  $("n-key").addEventListener("change", function () { state.nk = +$("n-key").value; AK.render(); });

  // ---- the selection strip: the chosen tokens' summed or mean attention
  function drawSelection(g, labels) {
    var sel = state.sel, box = $("selection");
    box.hidden = !sel.items.length || state.view === "stats" || state.view === "neuron";
    if (box.hidden) return;
    var heads = g === AK.S() ? AK.heads() : [0], l = g === AK.S() ? state.layer : 0;
    var v = sel.axis === "q" ? AK.combine(g, l, heads, sel.items, state.combine).w : AK.column(g, l, heads, sel.items, state.combine);
    var other = sel.axis === "q" ? labels[1] : labels[0], cv = $("sel-canvas"), n = v.length;
    cv.width = Math.max(1, n); cv.height = 1;
    var img = cv.getContext("2d").createImageData(n, 1), m = AK.maxOf(v);
    for (var i = 0; i < n; i++) AK.paint(img.data, i, AK.toUnit(v[i], m, state.scale));
    cv.getContext("2d").putImageData(img, 0, 0);
    cv.style.imageRendering = "pixelated";
    var names = sel.items.slice(0, 5).map(function (i) { return "#" + i + " " + AK.plain((sel.axis === "q" ? labels[0] : labels[1])[i]); });
    $("sel-title").textContent = (state.combine === "sum" ? "Sum" : "Mean") + " of " + (sel.axis === "q" ?
      "what the selected queries attend to" : "the attention the selected keys receive") + ": " + names.join(", ") +
      (sel.items.length > 5 ? " and " + (sel.items.length - 5) + " more" : "") + " (shift-click or drag to add)";
    var top = Array.prototype.slice.call(v).map(function (x, i) { return [x, i]; })
      .sort(function (a, b) { return b[0] - a[0]; }).slice(0, 8);
    $("sel-top").textContent = "most: " + top.map(function (t) { return "#" + t[1] + " " + AK.plain(other[t[1]]) + " " + AK.fmt(t[0]); }).join(",  ");
  }

  // ---- generation: the current token's attention over the prompt and earlier outputs
  function drawGeneration() {
    var S = AK.S(), box = $("gen-box");
    box.hidden = S.genStart === null;
    if (box.hidden) return;
    var n = S.shape[2] - S.genStart, cur = S.genStart + state.step - 1, heads = AK.heads();
    $("step").max = String(n); $("step").value = String(state.step);
    $("step-text").textContent = "step " + state.step + " of " + n + ": #" + cur + " " + AK.plain(S.tokens[cur]);
    var v = AK.combine(S, state.layer, heads, [cur], "mean").w, m = AK.maxOf(v), text = $("gen-text");
    clear(text);
    for (var i = 0; i < S.shape[2]; i++) {
      var s = el("span", i === cur ? "current" : i > cur ? "later" : "", S.tokens[i].replace(/\n/g, "\u21b5\n"));
      if (i < cur) s.style.background = AK.shade(v[i], m);
      s.title = "#" + i + " " + AK.rawOf("q", i) + (i < cur ? "  " + AK.fmt(v[i]) : "");
      text.appendChild(s);
    }
  }
  $("step").addEventListener("input", function () {
    var S = AK.S();
    state.step = +$("step").value;
    var cur = S.genStart + state.step - 1;
    state.pin = { axis: "q", i: cur }; state.sel = { axis: "q", items: [cur] };
    state.win = Math.max(0, cur - 40);
    AK.render();
  });

  // ---- saving the view: one SVG (vector lines and text, the canvases as images); PNG from it
  var SVG_NS = ["http", "//www.w3.org/2000/svg"].join(":");  // a name, never fetched
  function svgOf() {
    var W = 0, H = 0, parts = [], title = AK.D.title + " \u2014 " + AK.describeView();
    function esc(s) { return String(s).replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; }); }
    function image(cv, x, y, w, h) {
      parts.push('<image x="' + x + '" y="' + y + '" width="' + w + '" height="' + h + '" preserveAspectRatio="none" ' +
        'style="image-rendering:pixelated" href="' + cv.toDataURL("image/png") + '"/>');
    }
    var fg = getComputedStyle(document.body).color, bg = getComputedStyle(document.body).backgroundColor;
    if (state.view === "head") {
      var q = $("q-col").children, k = $("k-col").children, lines = $("lines"), ROW = AK.views.head.ROW, lw = 160;
      H = Math.max(q.length, k.length) * ROW + 40; W = 2 * lw + lines.clientWidth + 20;
      image(lines, lw, 30, lines.clientWidth, lines.clientHeight);
      [[q, lw - 6, "end"], [k, lw + lines.clientWidth + 6, "start"]].forEach(function (c) {
        for (var i = 0; i < c[0].length; i++) {
          var bgc = c[0][i].style.background;
          if (bgc) parts.push('<rect x="' + (c[2] === "end" ? c[1] - 150 : c[1] - 4) + '" y="' + (30 + i * ROW + 2) + '" width="154" height="' + (ROW - 4) + '" fill="' + bgc + '"/>');
          parts.push('<text x="' + c[1] + '" y="' + (30 + i * ROW + ROW / 2 + 4) + '" text-anchor="' + c[2] + '" font-family="monospace" font-size="13" fill="' + fg + '">' + esc(c[0][i].textContent) + "</text>");
        }
      });
    } else if (state.view === "model" || state.view === "stats" || state.view === "neuron") {
      var cvs = state.view === "model" ? thumbs : Array.prototype.slice.call($("neuron").querySelectorAll("canvas"));
      var S = AK.S(), nH = S.shape[1], side = 64;
      if (state.view === "stats") { W = 400; H = 60; parts.push('<text x="10" y="45" fill="' + fg + '">Save the table from the page itself.</text>'); }
      cvs.forEach(function (cv, i) {
        var x = state.view === "model" ? 70 + (i % nH) * (side + 6) : 10, y = state.view === "model" ? 40 + Math.floor(i / nH) * (side + 6) : 40 + i * 70;
        var w = state.view === "model" ? side : cv.width, h = state.view === "model" ? side : cv.height;
        image(cv, x, y, w, h); W = Math.max(W, x + w + 10); H = Math.max(H, y + h + 10);
        if (state.view === "model" && i % nH === 0) parts.push('<text x="64" y="' + (y + side / 2) + '" text-anchor="end" font-size="11" fill="' + fg + '">' + esc(S.layers[i / nH]) + "</text>");
      });
    } else {
      var m = AK.views.matrix.canvas, cur = AK.views.matrix.current(), lab = 120;
      var w2 = parseFloat(m.style.width), h2 = parseFloat(m.style.height);
      W = lab + w2 + 20; H = lab + h2 + 40;
      image(m, lab, 30, w2, h2);
      var step = Math.max(1, Math.ceil(12 / cur.cell));
      for (var i2 = 0; i2 < cur.rows; i2 += step) parts.push('<text x="' + (lab - 4) + '" y="' + (30 + (i2 + 0.5) * cur.cell + 4) + '" text-anchor="end" font-family="monospace" font-size="10" fill="' + fg + '">' + esc(AK.plain(cur.labels[0][cur.win[0] + i2])) + "</text>");
      for (var j2 = 0; j2 < cur.cols; j2 += step) { var x2 = lab + (j2 + 0.5) * cur.cell; parts.push('<text transform="translate(' + (x2 + 4) + "," + (34 + h2) + ') rotate(90)" font-family="monospace" font-size="10" fill="' + fg + '">' + esc(AK.plain(cur.labels[1][cur.win[2] + j2])) + "</text>"); }
    }
    W = Math.max(W, 420);
    return '<svg xmlns="' + SVG_NS + '" width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + " " + H + '">' +
      '<rect width="100%" height="100%" fill="' + bg + '"/><text x="8" y="18" font-size="13" fill="' + fg + '">' + esc(title) + "</text>" + parts.join("") + "</svg>";
  }
  function download(name, blob) {
    var a = el("a"); a.href = URL.createObjectURL(blob); a.download = name;
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(function () { URL.revokeObjectURL(a.href); }, 1000);
  }
  function savePNG() {
    var svg = svgOf(), img = new Image();
    img.onload = function () {
      var cv = el("canvas"), m = /width="(\d+(?:\.\d+)?)" height="(\d+(?:\.\d+)?)"/.exec(svg);
      cv.width = Math.ceil(+m[1]) * 2; cv.height = Math.ceil(+m[2]) * 2;
      var ctx = cv.getContext("2d"); ctx.scale(2, 2); ctx.imageSmoothingEnabled = false; ctx.drawImage(img, 0, 0);
      cv.toBlob(function (b) { download("attention-" + state.view + ".png", b); document.body.dataset.saved = "png"; }, "image/png");
    };
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg);
  }
  $("save-svg").addEventListener("click", function () {
    download("attention-" + state.view + ".svg", new Blob([svgOf()], { type: "image/svg+xml" }));
    document.body.dataset.saved = "svg";
  });
  $("save-png").addEventListener("click", savePNG);
  AK.views.model = { draw: drawModel };
  AK.views.stats = { draw: drawStats };
  AK.views.neuron = { draw: drawNeuron };
  AK.drawSelection = drawSelection; AK.drawGeneration = drawGeneration; AK.svgOf = svgOf;
})(AK);
