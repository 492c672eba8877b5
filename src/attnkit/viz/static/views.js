"use strict";
// attnkit's attention viewer, part 5: the model, statistics and neuron views, the selection
// strips (labelled) and the generation panel.
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state;

  // ---- model view: every layer x head as a thumbnail (block max on long pages)
  function ModelPanel(root) { this.root = root; this.box = root.querySelector(".thumbs"); this.key = null; this.thumbs = []; }
  ModelPanel.prototype.draw = function (side) {
    var S = side.S, nL = S.shape[0], nH = S.shape[1], box = this.box, self = this;
    AK.sideName(this.root.querySelector(".side-name"), side);
    if (this.key !== S.uid) {
      this.key = S.uid;
      var size = Math.max(40, Math.min(96, Math.floor(1100 / nH) - 8));
      clear(box); this.thumbs = [];
      box.style.gridTemplateColumns = "auto repeat(" + nH + ", " + size + "px)";
      box.appendChild(el("span", "col-label", ""));
      for (var h = 0; h < nH; h++) box.appendChild(el("span", "col-label", S.heads[h]));
      for (var l = 0; l < nL; l++) {
        box.appendChild(el("span", "row-label", S.layers[l]));
        for (var h2 = 0; h2 < nH; h2++) {
          var cv = el("canvas");
          cv.style.width = size + "px"; cv.style.height = size + "px"; cv.tabIndex = 0;
          cv.title = S.layers[l] + ", " + S.heads[h2] + ": " + S.stats["class"][l][h2] + "; click to open";
          cv.setAttribute("role", "button");
          cv.dataset.layer = String(l); cv.dataset.head = String(h2);
          cv.addEventListener("click", openThumb);
          cv.addEventListener("keydown", function (ev) { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); openThumb(ev); } });
          box.appendChild(cv); self.thumbs.push(cv);
        }
      }
    }
    var reg = AK.region(S);
    this.thumbs.forEach(function (cv) {
      var img = thumbImage(S, +cv.dataset.layer, +cv.dataset.head, reg);
      cv.width = img.width; cv.height = img.height;
      cv.getContext("2d").putImageData(img, 0, 0);
    });
  };
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

  // ---- statistics: a sortable table (a side column on a comparison); a row opens its head
  var COLS = [["side", "side"], ["layer", "layer"], ["head", "head"], ["class", "pattern"], ["score", "score"],
              ["entropy", "entropy (nats)"], ["normEntropy", "normalized entropy"], ["distance", "mean distance"],
              ["prev", "previous"], ["first", "first / sink"], ["self", "self"], ["local", "local \u00b14"]];
  // Every row of the table (also what the statistics CSV holds): [{side, S, layer, head, <stat>: value}].
  function statRows(sides) {
    var rows = [];
    sides.forEach(function (side) {
      var S = side.S, st = S.stats;
      for (var l = 0; l < S.shape[0]; l++) for (var h = 0; h < S.shape[1]; h++) {
        var r = { side: side.name, S: S, layer: l, head: h };
        COLS.forEach(function (c) { if (st[c[0]] !== undefined) r[c[0]] = st[c[0]][l][h]; });
        rows.push(r);
      }
    });
    return rows;
  }
  function statCols(sides) {
    var st = sides[0].S.stats;
    return COLS.filter(function (c) {
      return c[0] === "layer" || c[0] === "head" || (c[0] === "side" ? sides.length > 1 || !!AK.compare : st[c[0]] !== undefined);
    });
  }
  var lastSides = [];
  function drawStats(sides) {
    lastSides = sides;
    var cols = statCols(sides), rows = statRows(sides), key = state.sort.key;
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
        var v = c[0] === "layer" ? r.S.layers[r.layer] : c[0] === "head" ? r.S.heads[r.head] : r[c[0]];
        row.appendChild(el("td", c[0] === "class" || c[0] === "side" ? "cls" : "", typeof v === "number" ? v.toFixed(3) : String(v)));
      });
      var open = function () {
        if (AK.compare && sides.length > 1) state.side = "both";
        AK.openHead(r.layer, r.head, "matrix");
      };
      row.addEventListener("click", open);
      row.addEventListener("keydown", function (ev) { if (ev.key === "Enter") open(); });
      body.appendChild(row);
    });
  }
  function sortBy(ev) {
    var k = ev.currentTarget.dataset.key;
    state.sort = { key: k, dir: state.sort.key === k ? -state.sort.dir : 1 };
    drawStats(lastSides);
  }

  // ---- neuron view: q, k and the terms whose sum (times the scale) is the logit
  function options(select, S, tokens, n, chosen, found) {
    var key = S.uid + "|" + state.find + "|" + state.whole;
    if (select.dataset.key !== key) {
      select.dataset.key = key;
      clear(select);
      for (var i = 0; i < n; i++) {
        var o = el("option", "", "#" + i + " " + AK.plain(tokens[i]) + (found[i] ? "  \u25c6 match" : ""));
        o.value = String(i); select.appendChild(o);
      }
    }
    select.value = String(chosen);
  }
  function NeuronPanel(root) {
    this.root = root; this.box = root.querySelector(".neuron");
    this.nq = root.querySelector(".n-query"); this.nk = root.querySelector(".n-key"); this.nh = root.querySelector(".n-head");
    var self = this;
    this.nq.addEventListener("change", function () { state.nq = +self.nq.value; state.nk = null; AK.render(); });
    this.nk.addEventListener("change", function () { state.nk = +self.nk.value; AK.render(); });
  }
  // The query shown: the one chosen here, else the selection, else the current match, else the last.
  function neuronQuery(S) {
    var Q = S.shape[2];
    if (state.nq !== null && state.nq < Q) return state.nq;
    if (state.sel.axis === "q" && state.sel.items.length && state.sel.items[0] < Q) return state.sel.items[0];
    if (state.at && state.at.axis === "q" && state.at.i < Q) return state.at.i;
    return Q - 1;
  }
  NeuronPanel.prototype.draw = function (side) {
    var S = side.S, N = S.neuron, box = this.box;
    AK.sideName(this.root.querySelector(".side-name"), side);
    clear(box);
    var li = N ? N.layers.indexOf(state.layer) : -1, missing = AK.missing(S);
    this.root.querySelector(".neuron-pick").hidden = li < 0 || !!missing;
    if (missing || li < 0) { box.appendChild(el("p", "muted", missing || "q and k are not kept for this layer (see the notes above).")); return; }
    var h = AK.heads(S)[0] === undefined ? 0 : AK.heads(S)[0], d = N.dim, Q = S.shape[2], K = S.shape[3], nH = S.shape[1];
    var qi = neuronQuery(S);
    var kj = state.nk !== null && state.nk < K ? state.nk : AK.argmax(AK.row(S, state.layer, h, qi).w);
    // q is kept for page queries queryStart .. queryStop - 1, k for the keys in keyIndex (null: all)
    var q0 = N.queryStart || 0, nq = (N.queryStop === undefined ? Q : N.queryStop) - q0;
    var keys = N.keyIndex || null, nk = keys ? keys.length : K;
    if (keys && state.nk === null && keys.indexOf(kj) < 0) {
      var wr = AK.row(S, state.layer, h, qi).w;
      kj = keys.reduce(function (b, j) { return wr[j] > wr[b] ? j : b; }, keys[0]);
    }
    var found = AK.matches(S);
    options(this.nq, S, S.tokens, Q, qi, found.q); options(this.nk, S, S.keyTokens, K, kj, found.k);
    this.nh.textContent = S.layers[state.layer] + ", " + S.heads[h] + " (the first chosen head)" +
      (found.q[qi] ? "; the query is a match of the search" : "");
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
  };
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

  // ---- the selection strips: the chosen tokens' summed or mean attention, labelled
  var STRIP = '<div class="pane-title"></div><div class="strip-box"><canvas></canvas><div class="strip-labels"></div></div>' +
    '<div class="label-note"></div><div class="sel-top"></div>';
  function strips(n) {
    var box = $("strips");
    while (box.children.length < n) {
      var s = el("div", "strip");
      s.innerHTML = STRIP;
      s.querySelector("canvas").addEventListener("pointermove", stripTip);
      s.querySelector("canvas").addEventListener("pointerleave", AK.hideTip);
      box.appendChild(s);
    }
    for (var i = 0; i < box.children.length; i++) box.children[i].hidden = i >= n;
    return Array.prototype.slice.call(box.children, 0, n);
  }
  function stripTip(ev) {
    var s = ev.currentTarget.parentNode.parentNode.data;
    if (!s) return;
    var r = ev.currentTarget.getBoundingClientRect(), j = Math.floor((ev.clientX - r.left) / r.width * s.v.length);
    if (j >= 0 && j < s.v.length) AK.tip(ev, "#" + j + " " + AK.plain(s.other[j]) + "   " + (s.signed && s.v[j] > 0 ? "+" : "") + AK.fmt(s.v[j]));
  }
  // items: [{side, g, layer, heads, signed}] in the order drawn.
  function drawSelection(items) {
    var sel = state.sel, box = $("selection");
    box.hidden = !sel.items.length || state.view === "stats" || state.view === "neuron" || state.view === "image" ||
      state.view === "explain" || !items.length;
    if (box.hidden) return;
    var nodes = strips(items.length);
    items.forEach(function (it, n) {
      var node = nodes[n], S = it.side.S, q = sel.axis === "q", limit = q ? S.shape[2] : S.shape[3];
      var chosen = sel.items.filter(function (i) { return i < limit; }), missing = it.absent;
      var title = node.querySelector(".pane-title"), cv = node.querySelector("canvas");
      node.querySelector(".strip-box").hidden = !!missing || !chosen.length;
      if (missing || !chosen.length) {
        node.data = null; title.textContent = (it.side.name ? it.side.name + ": " : "") + (missing || "the selection is beyond this side's tokens");
        node.querySelector(".label-note").textContent = ""; node.querySelector(".sel-top").textContent = "";
        return;
      }
      var v = it.signed ? diffOf(it.g, it.layer, it.heads, sel.axis, chosen) : q ? AK.combine(it.g, it.layer, it.heads, chosen, state.combine).w
        : AK.column(it.g, it.layer, it.heads, chosen, state.combine);
      var mine = q ? S.tokens : S.keyTokens, other = q ? S.keyTokens : S.tokens, w = v.length;
      node.data = { v: v, other: other, signed: it.signed };
      cv.width = Math.max(1, w); cv.height = 1;
      var ctx = cv.getContext("2d"), img = ctx.createImageData(w, 1), m = it.signed ? AK.absMaxOf(v) : AK.maxOf(v);
      for (var i = 0; i < w; i++) {
        if (it.signed) AK.paintSigned(img.data, i, AK.toSigned(v[i], m, state.scale));
        else AK.paint(img.data, i, AK.toUnit(v[i], m, state.scale));
      }
      ctx.putImageData(img, 0, 0);
      var names = chosen.slice(0, 5).map(function (i) { return "#" + i + " " + AK.plain(mine[i]); });
      title.textContent = (it.side.name ? (it.signed ? "A \u2212 B" : it.side.name) + ": " : "") +
        (state.combine === "sum" ? "Sum" : "Mean") + " of " + (q ? "what the selected queries attend to" :
        "the attention the selected keys receive") + ": " + names.join(", ") +
        (chosen.length > 5 ? " and " + (chosen.length - 5) + " more" : "") + (n ? "" : " (shift-click or drag to add)");
      stripLabels(node, other, w, q ? "key" : "query", S);
      var top = Array.prototype.slice.call(v).map(function (x, i) { return [x, i]; })
        .sort(function (a, b) { return Math.abs(b[0]) - Math.abs(a[0]); }).slice(0, 8);
      node.querySelector(".sel-top").textContent = (it.signed ? "largest differences: " : "most: ") + top.map(function (t) {
        return "#" + t[1] + " " + AK.plain(other[t[1]]) + " " + (it.signed && t[0] > 0 ? "+" : "") + AK.fmt(t[0]);
      }).join(",  ");
    });
  }
  function diffOf(d, l, heads, axis, chosen) {
    if (axis === "q") {
      var out = new Float32Array(d.C);
      chosen.forEach(function (i) { var r = AK.diffRow(d, l, heads, i); for (var j = 0; j < d.C; j++) out[j] += r[j]; });
      if (state.combine !== "sum") for (var j2 = 0; j2 < d.C; j2++) out[j2] /= chosen.length;
      return out;
    }
    var col = new Float32Array(d.R);
    for (var i = 0; i < d.R; i++) {
      var row = AK.diffRow(d, l, heads, i), s = 0;
      chosen.forEach(function (j) { s += row[j]; });
      col[i] = state.combine === "sum" ? s : s / chosen.length;
    }
    return col;
  }
  // Labels under the strip, one per token down to 12 px each, else every step-th (and the note says so).
  function stripLabels(node, labels, n, what, S) {
    var box = node.querySelector(".strip-labels"), width = node.querySelector(".strip-box").clientWidth || 800;
    var cell = width / n, step = Math.max(1, Math.ceil(12 / cell)), found = AK.matches(S), longest = 1;
    clear(box);
    for (var u = 0; u < n; u += step) longest = Math.max(longest, AK.plain(labels[u]).length);
    var tall = Math.min(88, 10 + 7 * longest);
    box.style.height = tall + "px"; box.parentNode.style.paddingBottom = tall + 4 + "px";
    for (var t = 0; t < n; t += step) {
      var s = el("span", found[what === "key" ? "k" : "q"][t] ? "match" : "", AK.plain(labels[t]));
      s.style.left = Math.max(0, (t + 0.5) * cell - 6) + "px";
      s.title = "#" + t + " " + JSON.stringify(labels[t]);
      box.appendChild(s);
    }
    node.querySelector(".label-note").textContent = step > 1 ? "Labels name every " + AK.ordinal(step) + " " + what +
      " (#0, #" + step + ", #" + 2 * step + ", \u2026); hover the strip for each one." : "";
  }

  // ---- generation: the current token's attention over the prompt and earlier outputs
  function drawGeneration() {
    var S = AK.S(), box = $("gen-box");
    box.hidden = S.genStart === null;
    if (box.hidden) return;
    var n = S.shape[2] - S.genStart, cur = S.genStart + state.step - 1, heads = AK.heads(S), found = AK.matches(S);
    $("step").max = String(n); $("step").value = String(state.step);
    $("step-text").textContent = "step " + state.step + " of " + n + ": #" + cur + " " + AK.plain(S.tokens[cur]);
    var v = AK.combine(S, state.layer, heads, [cur], "mean").w, m = AK.maxOf(v), text = $("gen-text");
    clear(text);
    for (var i = 0; i < S.shape[2]; i++) {
      var s = el("span", (i === cur ? "current" : i > cur ? "later" : "") + (found.q[i] ? " match" : ""),
                 S.tokens[i].replace(/\n/g, "\u21b5\n"));
      if (i < cur) s.style.background = AK.shade(v[i], m);
      s.title = "#" + i + " " + AK.rawOf(S, "q", i) + (i < cur ? "  " + AK.fmt(v[i]) : "");
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

  function panelView(Make, containerId) {
    var panels = [];
    return {
      draw: function (sides) {
        AK.panelRoots($(containerId), sides.length).forEach(function (root, i) {
          if (!panels[i] || panels[i].root !== root) panels[i] = new Make(root);
          panels[i].draw(sides[i]);
        });
      },
      panels: function () { return panels; }
    };
  }
  AK.views.model = panelView(ModelPanel, "model-panels");
  AK.views.neuron = panelView(NeuronPanel, "neuron-panels");
  AK.views.stats = { draw: drawStats, rows: statRows, cols: statCols };
  AK.drawSelection = drawSelection; AK.drawGeneration = drawGeneration;
})(AK);
