"use strict";
// attnkit's attention viewer, part 2 of 5: the matrix view (also draws rollout and flow).
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state;
  var DETAIL = 128;  // tokens per side of a long page's exact window
  var matrix = $("matrix"), current = null, drag = null;

  function labelStrip(box, labels, from, to, cell, horizontal, selected) {
    clear(box);
    var n = to - from, step = Math.max(1, Math.ceil(12 / cell)), longest = 0;
    for (var i = from; i < to; i += step) longest = Math.max(longest, labels[i].length);
    var extent = Math.min(130, 12 + 7 * longest);
    if (horizontal) { box.style.width = n * cell + "px"; box.style.height = extent + "px"; }
    else { box.style.height = n * cell + "px"; box.style.width = extent + "px"; }
    for (var t = 0; t < n; t += step) {
      var s = el("span", selected.indexOf(from + t) >= 0 ? "sel" : "", AK.plain(labels[from + t]));
      s.dataset.index = String(from + t);
      s.title = "#" + (from + t) + " " + AK.rawOf(labels === AK.S().tokens ? "q" : "k", from + t) +
        "  (click: select; shift-click: add)";
      var center = Math.max(0, (t + 0.5) * cell - 7);
      if (horizontal) s.style.left = center + "px"; else s.style.top = center + "px";
      box.appendChild(s);
    }
  }
  function fitZoom(rows, cols) {
    return Math.max(1, Math.min(24, Math.floor(720 / Math.max(rows, cols))));
  }
  // The region drawn cell by cell: all of it on a dense page, a window around `center` on a long one.
  function window_(g, reg) {
    if (g.mode === "dense") return reg.slice();
    var c = state.center || [reg[0], reg[2]];
    var rh = Math.min(DETAIL, reg[1] - reg[0]), cw = Math.min(DETAIL, reg[3] - reg[2]);
    var r0 = Math.max(reg[0], Math.min(reg[1] - rh, c[0] - (rh >> 1)));
    var c0 = Math.max(reg[2], Math.min(reg[3] - cw, c[1] - (cw >> 1)));
    return [r0, r0 + rh, c0, c0 + cw];
  }
  // g: a decoded grid; layer, heads: what to average; opts.labels: [query tokens, key tokens].
  function draw(g, layer, heads, reg, opts) {
    var win = window_(g, reg), rows = win[1] - win[0], cols = win[3] - win[2];
    if (!state.zoom) state.zoom = fitZoom(rows, cols);
    var cell = state.zoom, m = new Float32Array(rows * cols), unknown = null, floors = null;
    if (g.mode === "long") {
      unknown = new Uint8Array(rows * cols); floors = new Float32Array(rows);
      var pm = AK.pooled(g, layer, heads, "mean"), b = g.block;
    }
    for (var i = 0; i < rows; i++) {
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
    var vmax = AK.maxOf(m);
    current = { g: g, win: win, reg: reg, m: m, unknown: unknown, floors: floors, rows: rows, cols: cols,
                cell: cell, heads: heads, layer: layer, labels: opts.labels };
    matrix.width = cols; matrix.height = rows;
    matrix.style.width = cols * cell + "px"; matrix.style.height = rows * cell + "px";
    var ctx = matrix.getContext("2d"), img = ctx.createImageData(cols, rows), px = img.data;
    for (var p = 0; p < m.length; p++) {
      var u = AK.toUnit(m[p], vmax, state.scale);
      AK.paint(px, p, unknown && unknown[p] ? 0.35 * u : u);
    }
    ctx.putImageData(img, 0, 0);
    var selQ = state.sel.axis === "q" ? state.sel.items : [], selK = state.sel.axis === "k" ? state.sel.items : [];
    labelStrip($("x-labels"), opts.labels[1], win[2], win[3], cell, true, selK);
    labelStrip($("y-labels"), opts.labels[0], win[0], win[1], cell, false, selQ);
    var box = $("matrix-box");
    Array.prototype.slice.call(box.querySelectorAll(".divider-line, .sel-band")).forEach(function (d) { d.remove(); });
    var S = AK.S();
    if (opts.pairs && S.pairStart !== null) {
      if (S.pairStart > win[0] && S.pairStart < win[1]) line(box, 0, (S.pairStart - win[0]) * cell - 1, cols * cell, 2);
      if (S.pairKeyStart > win[2] && S.pairKeyStart < win[3]) line(box, (S.pairKeyStart - win[2]) * cell - 1, 0, 2, rows * cell);
    }
    selQ.forEach(function (i) {
      if (i >= win[0] && i < win[1]) band(box, 0, (i - win[0]) * cell, cols * cell, cell);
    });
    $("cell-mark").hidden = true;
    drawColorbar(vmax);
    $("zoom").value = String(cell);
    $("zoom-text").textContent = cell + " px per token";
    var exact = g.mode === "dense" ? "every weight exact" : "exact: each query's top " + g.k +
      " keys; fainter cells: below them (block mean, capped at the row's " + g.k + "th weight)";
    $("matrix-title").textContent = "queries " + win[0] + "\u2013" + (win[1] - 1) + " \u00d7 keys " + win[2] +
      "\u2013" + (win[3] - 1) + " (" + exact + ")";
    $("overview-pane").hidden = g.mode === "dense";
    $("overview-box").hidden = g.mode === "dense";
    if (g.mode === "long") drawOverview(g, layer, heads, reg, win);
  }
  function line(box, x, y, w, h) {
    var d = el("div", "divider-line");
    d.style.left = x + "px"; d.style.top = y + "px"; d.style.width = w + "px"; d.style.height = h + "px";
    box.appendChild(d);
  }
  function band(box, x, y, w, h) {
    var d = el("div", "sel-band");
    d.style.left = x + "px"; d.style.top = y + "px"; d.style.width = w + "px"; d.style.height = h + "px";
    box.appendChild(d);
  }
  var overview = $("overview-canvas"), ovState = null;
  function drawOverview(g, layer, heads, reg, win) {
    var b = g.block, r0 = Math.floor(reg[0] / b), r1 = Math.ceil(reg[1] / b);
    var c0 = Math.floor(reg[2] / b), c1 = Math.ceil(reg[3] / b), rows = r1 - r0, cols = c1 - c0;
    var p = AK.pooled(g, layer, heads, state.overview), vals = new Float32Array(rows * cols);
    for (var i = 0; i < rows; i++) for (var j = 0; j < cols; j++) vals[i * cols + j] = p[(r0 + i) * g.Kb + c0 + j];
    var vmax = AK.maxOf(vals), side = Math.max(1, Math.floor(512 / Math.max(rows, cols)));
    overview.width = cols; overview.height = rows;
    overview.style.width = cols * side + "px"; overview.style.height = rows * side + "px";
    var ctx = overview.getContext("2d"), img = ctx.createImageData(cols, rows);
    for (var q = 0; q < vals.length; q++) AK.paint(img.data, q, AK.toUnit(vals[q], vmax, state.scale));
    ctx.putImageData(img, 0, 0);
    ctx.strokeStyle = "#c2410c"; ctx.lineWidth = Math.max(0.5, 1.5 / side);
    ctx.strokeRect(win[2] / b - c0, win[0] / b - r0, (win[3] - win[2]) / b, (win[1] - win[0]) / b);
    ovState = { b: b, r0: r0, c0: c0, side: side };
    $("overview-title").textContent = "overview: block " + state.overview + " over " + b + "\u00d7" + b +
      " tokens (exact); click to look closer";
  }
  overview.addEventListener("click", function (ev) {
    if (!ovState) return;
    var r = overview.getBoundingClientRect();
    var j = Math.floor((ev.clientX - r.left) / ovState.side), i = Math.floor((ev.clientY - r.top) / ovState.side);
    state.center = [(ovState.r0 + i) * ovState.b + (ovState.b >> 1), (ovState.c0 + j) * ovState.b + (ovState.b >> 1)];
    AK.render();
  });
  function drawColorbar(vmax) {
    var bar = $("bar"), ctx = bar.getContext("2d"), img = ctx.createImageData(1, 256);
    for (var y = 0; y < 256; y++) AK.paint(img.data, y, (255 - y) / 255);
    ctx.putImageData(img, 0, 0);
    $("bar-max").textContent = AK.fmt(vmax);
    $("bar-min").textContent = state.scale === "log" ? "\u2264 " + AK.fmt(vmax * AK.LOG_FLOOR) : "0";
    $("bar-name").textContent = state.scale + " scale";
  }
  function cellAt(ev) {
    var r = matrix.getBoundingClientRect(), cell = current.cell;
    return [Math.floor((ev.clientY - r.top) / cell), Math.floor((ev.clientX - r.left) / cell)];
  }
  function markLabels(box, index) {
    var spans = box.children;
    for (var s = 0; s < spans.length; s++) spans[s].classList.toggle("hi", +spans[s].dataset.index === index);
  }
  matrix.addEventListener("pointermove", function (ev) {
    if (!current) return;
    var at = cellAt(ev), i = at[0], j = at[1], mark = $("cell-mark");
    if (i < 0 || j < 0 || i >= current.rows || j >= current.cols) { AK.hideTip(); mark.hidden = true; return; }
    var qi = current.win[0] + i, kj = current.win[2] + j, n = current.heads.length, p = i * current.cols + j;
    var value = current.unknown && current.unknown[p] ? "below the row's top " + current.g.k + " (\u2264 " +
      AK.fmt(current.floors[i]) + ")" : AK.fmt(current.m[p]);
    AK.tip(ev, "#" + qi + " " + AK.plain(current.labels[0][qi]) + " \u2192 #" + kj + " " +
      AK.plain(current.labels[1][kj]) + "   " + value + (n === 1 ? "" : "  (mean of " + n + " heads)"));
    mark.style.left = (j * current.cell) + "px"; mark.style.top = (i * current.cell) + "px";
    mark.style.width = Math.max(current.cell, 3) + "px"; mark.style.height = Math.max(current.cell, 3) + "px";
    mark.hidden = false;
    markLabels($("x-labels"), kj); markLabels($("y-labels"), qi);
    if (drag !== null) {
      var lo = Math.min(drag, qi), hi = Math.max(drag, qi), items = [];
      for (var t = lo; t <= hi; t++) items.push(t);
      state.sel = { axis: "q", items: items };
    }
  });
  matrix.addEventListener("pointerdown", function (ev) {
    if (!current) return;
    var at = cellAt(ev);
    if (at[0] < 0 || at[0] >= current.rows) return;
    var qi = current.win[0] + at[0];
    if (ev.shiftKey || ev.ctrlKey || ev.metaKey) { AK.toggleSel("q", qi); return; }
    drag = qi;
    state.sel = { axis: "q", items: [qi] };
  });
  window.addEventListener("pointerup", function () {
    if (drag === null) return;
    drag = null;
    AK.render();
  });
  matrix.addEventListener("pointerleave", function () { AK.hideTip(); $("cell-mark").hidden = true; });
  function labelClick(axis) {
    return function (ev) {
      var t = ev.target;
      if (!t.dataset || t.dataset.index === undefined) return;
      var i = +t.dataset.index;
      if (ev.shiftKey || ev.ctrlKey || ev.metaKey) AK.toggleSel(axis, i);
      else { state.sel = { axis: axis, items: [i] }; AK.render(); }
    };
  }
  $("y-labels").addEventListener("click", labelClick("q"));
  $("x-labels").addEventListener("click", labelClick("k"));
  function setZoom(z) { state.zoom = Math.max(1, Math.min(40, Math.round(z))); AK.render(); }
  $("zoom").addEventListener("input", function () { setZoom(+$("zoom").value); });
  $("zoom-in").addEventListener("click", function () { setZoom(state.zoom + Math.max(1, state.zoom / 4)); });
  $("zoom-out").addEventListener("click", function () { setZoom(state.zoom - Math.max(1, state.zoom / 5)); });
  $("matrix-scroll").addEventListener("wheel", function (ev) {
    if (!ev.ctrlKey) return;
    ev.preventDefault();
    setZoom(state.zoom * (ev.deltaY < 0 ? 1.25 : 0.8));
  }, { passive: false });
  AK.views.matrix = { draw: draw, current: function () { return current; }, canvas: matrix };
})(AK);
