"use strict";
// attnkit's attention viewer, part 3: the matrix view (also draws rollout and flow), one panel per
// side of a comparison and one for their difference (A - B, made in Python).
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state;
  var DETAIL = 128;  // tokens per side of a long page's exact window
  var READ = 12;     // px per token from which every row and column has its label
  var drag = null, ordinal = AK.ordinal;

  // Labels along one side; thinned to one per `step` tokens below READ px (the current match,
  // the selection and the search's matches are always marked). Returns the step.
  function labelStrip(box, labels, from, to, cell, horizontal, axis, marks) {
    clear(box);
    var n = to - from, step = Math.max(1, Math.ceil(READ / cell)), longest = 0;
    for (var i = from; i < to; i += step) longest = Math.max(longest, labels[i].length);
    var extent = Math.min(130, 12 + 7 * Math.max(longest, 4));
    if (horizontal) { box.style.width = n * cell + "px"; box.style.height = extent + "px"; }
    else { box.style.height = n * cell + "px"; box.style.width = extent + "px"; }
    function label(t, cls) {
      var s = el("span", cls, AK.plain(labels[from + t]));
      s.dataset.index = String(from + t);
      s.title = marks.S ? "#" + (from + t) + " " + AK.rawOf(marks.S, axis, from + t) + "  (click: select; shift-click: add)"
        : labels[from + t];
      var center = Math.max(0, (t + 0.5) * cell - 7);
      if (horizontal) s.style.left = center + "px"; else s.style.top = center + "px";
      box.appendChild(s);
    }
    var forced = [];
    if (marks.at !== null && marks.at >= from && marks.at < to) forced.push(marks.at - from);
    marks.sel.forEach(function (i) { if (i >= from && i < to && forced.length < 40) forced.push(i - from); });
    for (var t = 0; t < n; t += step) {
      if (forced.some(function (f) { return f !== t && Math.abs(f - t) * cell < READ; })) continue;
      label(t, (marks.sel.indexOf(from + t) >= 0 ? "sel" : "") + (marks.match[from + t] ? " match" : ""));
    }
    forced.forEach(function (f) {
      if (f % step) label(f, "forced" + (marks.sel.indexOf(from + f) >= 0 ? " sel" : "") + (marks.match[from + f] ? " match" : ""));
    });
    var spans = box.querySelectorAll("span");
    for (var k = 0; k < spans.length; k++) if (+spans[k].dataset.index === marks.at) spans[k].classList.add("current");
    for (var m = from; m < to; m++) {
      if (!marks.match[m] || (step === 1 && cell >= READ)) continue;
      var tick = el("i", "tick");
      if (horizontal) { tick.style.left = (m - from) * cell + "px"; tick.style.width = Math.max(2, cell) + "px"; }
      else { tick.style.top = (m - from) * cell + "px"; tick.style.height = Math.max(2, cell) + "px"; }
      box.appendChild(tick);
    }
    return step;
  }
  function autoZoom(rows, cols, panels) {
    var fit = Math.floor((panels > 1 ? 420 : 720) / Math.max(rows, cols));
    return fit >= READ ? Math.min(24, fit) : READ;
  }
  function fitZoom(rows, cols) { return Math.max(1, Math.min(24, Math.floor(720 / Math.max(rows, cols)))); }
  // The region drawn cell by cell: all of it on a dense page, a window around `center` on a long one.
  function window_(g, reg) {
    if (g.mode === "dense") return reg.slice();
    var at = state.at, c = state.center || (at ? [at.axis === "q" ? at.i : reg[0], at.axis === "k" ? at.i : at.i < g.K ? at.i : reg[2]] : [reg[0], reg[2]]);
    var rh = Math.min(DETAIL, reg[1] - reg[0]), cw = Math.min(DETAIL, reg[3] - reg[2]);
    var r0 = Math.max(reg[0], Math.min(reg[1] - rh, c[0] - (rh >> 1)));
    var c0 = Math.max(reg[2], Math.min(reg[3] - cw, c[1] - (cw >> 1)));
    return [r0, r0 + rh, c0, c0 + cw];
  }
  function blockWindow(d, reg) {  // a block-mean difference: the blocks that cover the region
    var b = d.block;
    return [Math.floor(reg[0] / b), Math.ceil(reg[1] / b), Math.floor(reg[2] / b), Math.ceil(reg[3] / b)];
  }

  function Panel(root) {
    var self = this;
    this.root = root; this.cur = null; this.scrolledTo = null;
    ["side-name", "overview-pane", "overview-title", "overview-labels", "overview-note", "matrix-title",
     "matrix-note", "matrix-scroll", "corner", "x-labels", "y-labels", "matrix-box", "cell-mark", "bar-max", "bar-min",
     "bar-name", "absent", "matrix-pane", "colorbar"].forEach(function (c) { self[c] = root.querySelector("." + c); });
    this.canvas = this["matrix-box"].querySelector("canvas");
    this.overview = root.querySelector(".overview-grid canvas");
    this.bar = this.colorbar.querySelector("canvas");
    var cv = this.canvas;
    cv.addEventListener("pointermove", function (ev) {
      var at = self.cellAt(ev);
      if (!at) { AK.hideTip(); view.mark(null); return; }
      view.mark(at);
      AK.tip(ev, view.describe(at));
      if (drag !== null && at.qi !== null) {
        var lo = Math.min(drag, at.qi), hi = Math.max(drag, at.qi), items = [];
        for (var t = lo; t <= hi; t++) items.push(t);
        state.sel = { axis: "q", items: items };
      }
    });
    cv.addEventListener("pointerdown", function (ev) {
      var at = self.cellAt(ev);
      if (!at) return;
      if (self.cur.blocks) {  // a block of the difference: look closer at it on both sides
        state.center = [at.qi, at.kj]; AK.render(); return;
      }
      if (ev.shiftKey || ev.ctrlKey || ev.metaKey) { AK.toggleSel("q", at.qi); return; }
      drag = at.qi;
      state.sel = { axis: "q", items: [at.qi] }; state.pin = null;
    });
    cv.addEventListener("pointerleave", function () { AK.hideTip(); view.mark(null); });
    [["y-labels", "q"], ["x-labels", "k"]].forEach(function (p) {
      self[p[0]].addEventListener("click", function (ev) {
        var t = ev.target;
        if (!t.dataset || t.dataset.index === undefined) return;
        var i = +t.dataset.index;
        if (ev.shiftKey || ev.ctrlKey || ev.metaKey) AK.toggleSel(p[1], i);
        else { state.sel = { axis: p[1], items: [i] }; state.pin = null; AK.render(); }
      });
    });
    this["matrix-scroll"].addEventListener("wheel", function (ev) {
      if (!ev.ctrlKey) return;
      ev.preventDefault();
      setZoom(state.zoom * (ev.deltaY < 0 ? 1.25 : 0.8));
    }, { passive: false });
    this["matrix-scroll"].addEventListener("scroll", function () { view.follow(self); });
    this.overview.addEventListener("click", function (ev) {
      var o = self.ov;
      if (!o) return;
      var r = self.overview.getBoundingClientRect();
      var j = Math.floor((ev.clientX - r.left) / o.side), i = Math.floor((ev.clientY - r.top) / o.side);
      state.center = [(o.r0 + i) * o.b + (o.b >> 1), (o.c0 + j) * o.b + (o.b >> 1)];
      AK.render();
    });
  }
  Panel.prototype.cellAt = function (ev) {
    var c = this.cur;
    if (!c) return null;
    var r = this.canvas.getBoundingClientRect();
    var i = Math.floor((ev.clientY - r.top) / c.cell), j = Math.floor((ev.clientX - r.left) / c.cell);
    if (i < 0 || j < 0 || i >= c.rows || j >= c.cols) return null;
    if (c.blocks) return { qi: (c.win[0] + i) * c.g.block + (c.g.block >> 1), kj: (c.win[2] + j) * c.g.block + (c.g.block >> 1), i: i, j: j };
    return { qi: c.win[0] + i, kj: c.win[2] + j };
  };
  // The values shown: mean over the chosen heads; a long page's cells outside the top-k are the
  // block mean capped at the row's k-th weight, and drawn fainter.
  Panel.prototype.compute = function (side, g, layer, heads, reg, opts) {
    var signed = !!opts.signed, blocks = signed && g.mode === "blocks";
    var win = blocks ? blockWindow(g, reg) : window_(g, reg), rows = win[1] - win[0], cols = win[3] - win[2];
    var m = new Float32Array(rows * cols), unknown = null, floors = null;
    if (g.mode === "long") {
      unknown = new Uint8Array(rows * cols); floors = new Float32Array(rows);
      var pm = AK.pooled(g, layer, heads, "mean"), b = g.block;
    }
    for (var i = 0; i < rows; i++) {
      if (signed) {
        var d = AK.diffRow(g, layer, heads, win[0] + i);
        for (var j0 = 0; j0 < cols; j0++) m[i * cols + j0] = d[win[2] + j0];
        continue;
      }
      var r = AK.combine(g, layer, heads, [win[0] + i], "mean");
      for (var j = 0; j < cols; j++) {
        var kj = win[2] + j;
        m[i * cols + j] = r.w[kj];
        if (r.known && !r.known[kj]) {
          unknown[i * cols + j] = 1;
          m[i * cols + j] = Math.min(r.floor, pm[Math.floor((win[0] + i) / b) * g.Kb + Math.floor(kj / b)]);
        }
      }
      if (floors) floors[i] = r.floor;
    }
    this.cur = { side: side, g: g, win: win, reg: reg, m: m, unknown: unknown, floors: floors, rows: rows,
                 cols: cols, heads: heads, layer: layer, labels: opts.labels, signed: signed, blocks: blocks,
                 vmax: signed ? AK.absMaxOf(m) : AK.maxOf(m) };
    return this.cur;
  };
  Panel.prototype.paint = function (vmax, note) {
    var c = this.cur, cv = this.canvas, S = c.side.S;
    var cell = c.blocks ? Math.max(4, fitZoom(c.rows, c.cols)) : state.zoom;
    c.cell = cell; c.vmax = vmax;
    cv.width = c.cols; cv.height = c.rows;
    cv.style.width = c.cols * cell + "px"; cv.style.height = c.rows * cell + "px";
    var ctx = cv.getContext("2d"), img = ctx.createImageData(c.cols, c.rows), px = img.data;
    for (var p = 0; p < c.m.length; p++) {
      if (c.signed) { AK.paintSigned(px, p, AK.toSigned(c.m[p], vmax, state.scale)); continue; }
      var u = AK.toUnit(c.m[p], vmax, state.scale);
      AK.paint(px, p, c.unknown && c.unknown[p] ? 0.35 * u : u);
    }
    ctx.putImageData(img, 0, 0);
    var box = this["matrix-box"];
    Array.prototype.slice.call(box.querySelectorAll(".divider-line, .sel-band, .at-band")).forEach(function (d) { d.remove(); });
    this["cell-mark"].hidden = true;
    var win = c.win, step;
    if (c.blocks) {
      var b = c.g.block, rowsOf = [], colsOf = [];
      for (var bi = win[0]; bi < win[1]; bi++) rowsOf.push("#" + bi * b);
      for (var bj = win[2]; bj < win[3]; bj++) colsOf.push("#" + bj * b);
      var none = { S: null, at: null, sel: [], match: [] };
      labelStrip(this["x-labels"], colsOf, 0, colsOf.length, cell, true, "k", none);
      step = labelStrip(this["y-labels"], rowsOf, 0, rowsOf.length, cell, false, "q", none);
      this["matrix-note"].textContent = "Each cell is the mean of a block of " + b + "\u00d7" + b + " tokens; labels name " +
        (step > 1 ? "the first token of every " + ordinal(step) + " block" : "each block's first token") + ". Click a block to look closer.";
    } else {
      var selQ = state.sel.axis === "q" ? state.sel.items : [], selK = state.sel.axis === "k" ? state.sel.items : [];
      var found = AK.matches(S), at = state.at;
      labelStrip(this["x-labels"], c.labels[1], win[2], win[3], cell, true, "k",
                 { S: S, at: at && (at.axis === "k" || S.sameKeys) ? at.i : null, sel: selK, match: found.k });
      step = labelStrip(this["y-labels"], c.labels[0], win[0], win[1], cell, false, "q",
                        { S: S, at: at && at.axis === "q" ? at.i : null, sel: selQ, match: found.q });
      this["matrix-note"].textContent = step > 1 ? "Labels name every " + ordinal(step) + " row and column (#" + win[0] + ", #" +
        (win[0] + step) + ", #" + (win[0] + 2 * step) + ", \u2026), the selection and the current match; zoom in (+) to label each."
        : "Every row and column is labelled.";
      if (c.opts_pairs && S.pairStart !== null) {
        if (S.pairStart > win[0] && S.pairStart < win[1]) strip(box, "divider-line", 0, (S.pairStart - win[0]) * cell - 1, c.cols * cell, 2);
        if (S.pairKeyStart > win[2] && S.pairKeyStart < win[3]) strip(box, "divider-line", (S.pairKeyStart - win[2]) * cell - 1, 0, 2, c.rows * cell);
      }
      selQ.forEach(function (i) { if (i >= win[0] && i < win[1]) strip(box, "sel-band", 0, (i - win[0]) * cell, c.cols * cell, cell); });
      if (at && at.axis === "q" && at.i >= win[0] && at.i < win[1]) strip(box, "at-band", 0, (at.i - win[0]) * cell, c.cols * cell, cell);
    }
    this.corner.style.width = this["y-labels"].style.width;
    this.colorbar_(vmax, c.signed, note);
    var exact = c.signed ? (c.blocks ? "A \u2212 B of the block means (exact)" : "A \u2212 B, every weight")
      : c.g.mode === "dense" ? "every weight exact" : "exact: each query's top " + c.g.k +
        " keys; fainter cells: below them (block mean, capped at the row's " + c.g.k + "th weight)";
    var title = c.blocks ? "blocks of queries " + win[0] * c.g.block + "\u2013" + (Math.min(win[1] * c.g.block, c.reg[1]) - 1)
      : "queries " + win[0] + "\u2013" + (win[1] - 1) + " \u00d7 keys " + win[2] + "\u2013" + (win[3] - 1);
    this["matrix-title"].textContent = title + " (" + exact + ")" + (c.blocks ? "" : "; " + cell + " px per token" +
      (cell >= READ && (c.rows * cell > 700 || c.cols * cell > 900) ? ": scroll to move, or \u2018whole\u2019 to see all" : ""));
    this["overview-pane"].hidden = c.g.mode !== "long";
    if (c.g.mode === "long") this.drawOverview(c);
    this.scrollToFocus(c);
  };
  function strip(box, cls, x, y, w, h) {
    var d = el("div", cls);
    d.style.left = x + "px"; d.style.top = y + "px"; d.style.width = w + "px"; d.style.height = h + "px";
    box.appendChild(d);
  }
  Panel.prototype.colorbar_ = function (vmax, signed, note) {
    var ctx = this.bar.getContext("2d"), img = ctx.createImageData(1, 256);
    for (var y = 0; y < 256; y++) {
      if (signed) AK.paintSigned(img.data, y, (127.5 - y) / 127.5); else AK.paint(img.data, y, (255 - y) / 255);
    }
    ctx.putImageData(img, 0, 0);
    var low = state.scale === "log" ? "\u2264 " + AK.fmt(vmax * AK.LOG_FLOOR) : "0";
    this["bar-max"].textContent = (signed ? "+" : "") + AK.fmt(vmax) + (signed ? " A higher" : "");
    this["bar-min"].textContent = signed ? AK.fmt(-vmax) + " B higher" : low;
    this["bar-name"].textContent = (signed ? "A \u2212 B, " : "") + state.scale + " scale" + (note ? "; " + note : "");
  };
  // Bring the current match (or the selection) into the scrolled view once, when it changes.
  Panel.prototype.scrollToFocus = function (c) {
    var f = state.at ? state.at.i : null, key = [f, c.cell, c.win.join(",")].join("|");
    if (f === null || c.blocks || this.scrolledTo === key) return;
    this.scrolledTo = key;
    var sc = this["matrix-scroll"], i = f - c.win[0], j = (state.at.axis === "k" ? f : Math.min(f, c.win[3] - 1)) - c.win[2];
    if (i >= 0 && i < c.rows && state.at.axis === "q") sc.scrollTop = Math.max(0, (i + 0.5) * c.cell - sc.clientHeight / 2);
    if (j >= 0 && j < c.cols) sc.scrollLeft = Math.max(0, (j + 0.5) * c.cell - sc.clientWidth / 2);
  };
  Panel.prototype.drawOverview = function (c) {
    var g = c.g, reg = c.reg, win = c.win, b = g.block, r0 = Math.floor(reg[0] / b), r1 = Math.ceil(reg[1] / b);
    var c0 = Math.floor(reg[2] / b), c1 = Math.ceil(reg[3] / b), rows = r1 - r0, cols = c1 - c0;
    var p = AK.pooled(g, c.layer, c.heads, state.overview), vals = new Float32Array(rows * cols);
    for (var i = 0; i < rows; i++) for (var j = 0; j < cols; j++) vals[i * cols + j] = p[(r0 + i) * g.Kb + c0 + j];
    var vmax = AK.maxOf(vals), side = Math.max(1, Math.floor((shown.length > 1 ? 320 : 512) / Math.max(rows, cols))), ov = this.overview;
    ov.width = cols; ov.height = rows;
    ov.style.width = cols * side + "px"; ov.style.height = rows * side + "px";
    var ctx = ov.getContext("2d"), img = ctx.createImageData(cols, rows);
    for (var q = 0; q < vals.length; q++) AK.paint(img.data, q, AK.toUnit(vals[q], vmax, state.scale));
    ctx.putImageData(img, 0, 0);
    ctx.strokeStyle = "#c2410c"; ctx.lineWidth = Math.max(0.5, 1.5 / side);
    ctx.strokeRect(win[2] / b - c0, win[0] / b - r0, (win[3] - win[2]) / b, (win[1] - win[0]) / b);
    this.ov = { b: b, r0: r0, c0: c0, side: side };
    // Row labels: the first query of every step-th block; the search's matches as ticks.
    var box = this["overview-labels"], S = c.side.S, step = Math.max(1, Math.ceil(14 / side)), found = AK.matches(S);
    clear(box);
    box.style.height = rows * side + "px";
    for (var bi = 0; bi < rows; bi += step) {
      var first = (r0 + bi) * b, s = el("span", "", "#" + first + " " + AK.plain(S.tokens[first]));
      s.style.top = (bi + 0.5) * side + "px";
      box.appendChild(s);
    }
    for (var m = reg[0]; m < reg[1]; m++) {
      if (!found.q[m]) continue;
      var tick = el("i", "tick");
      tick.style.top = (Math.floor(m / b) - r0) * side + "px"; tick.style.height = Math.max(2, side) + "px";
      box.appendChild(tick);
      m = (Math.floor(m / b) + 1) * b - 1;  // one tick per block
    }
    this["overview-title"].textContent = "overview: block " + state.overview + " over " + b + "\u00d7" + b +
      " tokens (exact); click to look closer";
    this["overview-note"].textContent = "Row labels name the first query of " + (step > 1 ? "every " + ordinal(step) +
      " block (#" + r0 * b + ", #" + (r0 + step) * b + ", \u2026)" : "each block") + "; the exact window is outlined.";
  };

  var panels = [], shown = [];
  function setZoom(z) { state.zoom = Math.max(1, Math.min(40, Math.round(z))); AK.render(); }
  $("zoom").addEventListener("input", function () { setZoom(+$("zoom").value); });
  $("zoom-in").addEventListener("click", function () { setZoom(state.zoom + Math.max(1, state.zoom / 4)); });
  $("zoom-out").addEventListener("click", function () { setZoom(state.zoom - Math.max(1, state.zoom / 5)); });
  $("zoom-fit").addEventListener("click", function () {
    var c = shown[0] && shown[0].cur;
    if (c) setZoom(fitZoom(c.rows, c.cols));
  });
  window.addEventListener("pointerup", function () {
    if (drag === null) return;
    drag = null;
    AK.render();
  });

  var view = {
    READ: READ,
    // items: [{side, g, layer, heads, signed}]; opts: {labels(side) -> [queries, keys], pairs}
    draw: function (items, opts) {
      var roots = AK.panelRoots($("matrix-panels"), items.length);
      shown = roots.map(function (root, i) {
        if (!panels[i] || panels[i].root !== root) panels[i] = new Panel(root);
        return panels[i];
      });
      $("matrix-view").classList.toggle("multi", items.length > 1);
      var vmax = 0, plain = 0;
      items.forEach(function (it, i) {
        var p = shown[i], S = it.side.S, missing = it.absent;
        AK.sideName(p["side-name"], it.side);
        p.absent.hidden = !missing; p.absent.textContent = missing || "";
        p.root.querySelector(".panel-body").hidden = !!missing;
        p.cur = null;
        if (missing) return;
        var c = p.compute(it.side, it.g, it.layer, it.heads, AK.region(S),
                          { labels: [S.tokens, S.keyTokens], signed: it.signed });
        c.opts_pairs = opts.pairs;
        if (!it.signed) { vmax = Math.max(vmax, c.vmax); plain++; }
      });
      var first = shown.filter(function (p) { return p.cur && !p.cur.blocks; })[0];
      if (first && !state.zoom) state.zoom = autoZoom(first.cur.rows, first.cur.cols, items.length);
      shown.forEach(function (p) {
        if (p.cur) p.paint(p.cur.signed ? p.cur.vmax : vmax, !p.cur.signed && plain > 1 ? "A and B share one range" : "");
      });
      $("zoom").value = String(state.zoom);
      $("zoom-text").textContent = state.zoom + " px per token";
    },
    current: function () { return shown[0] ? shown[0].cur : null; },
    panels: function () { return shown.slice(); },
    // The hovered cell, marked in every panel, and its value on each side.
    mark: function (at) {
      shown.forEach(function (p) {
        var c = p.cur, mark = p["cell-mark"];
        if (!c || !at) { if (mark) mark.hidden = true; return; }
        var i = c.blocks ? Math.floor(at.qi / c.g.block) - c.win[0] : at.qi - c.win[0];
        var j = c.blocks ? Math.floor(at.kj / c.g.block) - c.win[2] : at.kj - c.win[2];
        mark.hidden = i < 0 || j < 0 || i >= c.rows || j >= c.cols;
        mark.style.left = j * c.cell + "px"; mark.style.top = i * c.cell + "px";
        mark.style.width = Math.max(c.cell, 3) + "px"; mark.style.height = Math.max(c.cell, 3) + "px";
        [["x-labels", at.kj], ["y-labels", at.qi]].forEach(function (x) {
          var spans = p[x[0]].children;
          for (var s = 0; s < spans.length; s++) spans[s].classList.toggle("hi", +spans[s].dataset.index === x[1]);
        });
      });
    },
    describe: function (at) {
      var parts = [], head = shown[0] && shown[0].cur;
      shown.forEach(function (p) {
        var c = p.cur;
        if (!c) return;
        var i = c.blocks ? Math.floor(at.qi / c.g.block) - c.win[0] : at.qi - c.win[0];
        var j = c.blocks ? Math.floor(at.kj / c.g.block) - c.win[2] : at.kj - c.win[2];
        if (i < 0 || j < 0 || i >= c.rows || j >= c.cols) return;
        var q = i * c.cols + j, v = c.unknown && c.unknown[q] ? "below the row's top " + c.g.k + " (\u2264 " +
          AK.fmt(c.floors[i]) + ")" : (c.signed && c.m[q] > 0 ? "+" : "") + AK.fmt(c.m[q]);
        parts.push((shown.length > 1 ? (c.signed ? (c.blocks ? "A \u2212 B (block mean) " : "A \u2212 B ") : c.side.name + " ") : "") + v);
      });
      var S = head ? head.side.S : AK.S(), n = head ? head.heads.length : 1;
      return "#" + at.qi + " " + AK.plain(S.tokens[at.qi] || "") + " \u2192 #" + at.kj + " " +
        AK.plain(S.keyTokens[at.kj] || "") + "   " + parts.join("   ") + (n === 1 ? "" : "  (mean of " + n + " heads)");
    },
    // Panels scroll together.
    follow: function (from) {
      if (view.following) return;
      view.following = true;
      var sc = from["matrix-scroll"];
      shown.forEach(function (p) {
        if (p === from || !p.cur || (p.cur.blocks !== from.cur.blocks)) return;
        p["matrix-scroll"].scrollTop = sc.scrollTop; p["matrix-scroll"].scrollLeft = sc.scrollLeft;
      });
      setTimeout(function () { view.following = false; }, 0);
    }
  };
  AK.views.matrix = view;
})(AK);
