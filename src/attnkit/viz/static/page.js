"use strict";
// attnkit's attention viewer, part 5 of 5: the current set, controls, the address, rendering.
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state, D = AK.D;
  var S = null, VIEWS = ["head", "matrix", "model", "stats", "rollout", "neuron"], SUBTITLE = 240;

  AK.S = function () { return S; };
  AK.heads = function () {
    var out = [];
    for (var h = 0; h < S.shape[1]; h++) if (state.heads[h]) out.push(h);
    return out;
  };
  // Rows [r0, r1) and columns [c0, c1) shown: the sentence-pair filter, and the generation step.
  AK.region = function () {
    var Q = S.shape[2], K = S.shape[3], r = [0, Q, 0, K];
    if (S.pairStart !== null && state.filter !== "all") {
      var qa = state.filter.charAt(0) === "A", ka = state.filter.charAt(1) === "A";
      r = [qa ? 0 : S.pairStart, qa ? S.pairStart : Q, ka ? 0 : S.pairKeyStart, ka ? S.pairKeyStart : K];
    }
    if (S.genStart !== null) { var end = S.genStart + state.step; r = [0, end, 0, end]; }
    return r;
  };
  AK.rawOf = function (axis, i) {
    var raw = axis === "q" ? S.rawTokens : S.rawKeyTokens, shown = axis === "q" ? S.tokens : S.keyTokens;
    return JSON.stringify(raw ? raw[i] : shown[i]);
  };
  AK.headColor = function (h, alpha) {
    return "hsla(" + ((h * 360 / S.shape[1] + 8) % 360).toFixed(0) + ", 70%, " + (AK.dark ? 62 : 45) + "%, " + alpha + ")";
  };
  AK.argmax = function (a) { var b = 0; for (var i = 1; i < a.length; i++) if (a[i] > a[b]) b = i; return b; };
  AK.tip = function (ev, text) {
    var t = $("tooltip");
    t.textContent = text; t.style.left = (ev.clientX + 14) + "px"; t.style.top = (ev.clientY + 14) + "px"; t.hidden = false;
  };
  AK.hideTip = function () { $("tooltip").hidden = true; };
  AK.toggleSel = function (axis, i) {
    if (state.sel.axis !== axis) state.sel = { axis: axis, items: [] };
    var at = state.sel.items.indexOf(i);
    if (at >= 0) state.sel.items.splice(at, 1); else state.sel.items.push(i);
    state.pin = null;
    AK.render();
  };
  AK.openHead = function (l, h, view) {
    state.layer = l;
    for (var t = 0; t < S.shape[1]; t++) state.heads[t] = t === h;
    state.view = view; state.zoom = 0;
    AK.render();
  };
  AK.describeView = function () {
    var hs = AK.heads();
    return state.view + " view, " + S.name + ", " + S.layers[state.layer] + ", " +
      (hs.length === 1 ? S.heads[hs[0]] : hs.length + " heads");
  };

  // ---- static parts
  function header() {
    $("title").textContent = D.title;
    document.title = D.title;
    var sub = D.subtitle || "", long = sub.length > SUBTITLE;
    $("subtitle").textContent = long ? sub.slice(0, SUBTITLE) + " \u2026" : sub;
    $("subtitle-more").hidden = !long;
    $("subtitle-more").addEventListener("click", function () {
      var open = $("subtitle-more").textContent === "show less";
      $("subtitle").textContent = open ? sub.slice(0, SUBTITLE) + " \u2026" : sub;
      $("subtitle-more").textContent = open ? "show all (" + sub.length + " characters)" : "show less";
    });
    if (long) $("subtitle-more").textContent = "show all (" + sub.length + " characters)";
    $("meta").textContent = Object.keys(D.meta).map(function (k) { return k + ": " + D.meta[k]; }).join("  \u00b7  ");
    if (D.notes && D.notes.length) { $("notes").textContent = D.notes.join(" "); $("notes").hidden = false; }
    D.sets.forEach(function (set, i) { var o = el("option", "", set.name); o.value = String(i); $("set").appendChild(o); });
    $("set-box").hidden = D.sets.length < 2;
  }
  function setupSet() {
    S = D.sets[state.set];
    var nL = S.shape[0], nH = S.shape[1];
    state.layer = Math.min(state.layer, nL - 1);
    if (state.heads.length !== nH) { state.heads = []; for (var h = 0; h < nH; h++) state.heads.push(true); }
    if (S.pairStart === null) state.filter = "all";
    if (S.genStart !== null) state.step = state.step || S.shape[2] - S.genStart;
    state.sel = { axis: "q", items: [] }; state.pin = null; state.center = null; state.zoom = 0;
    clear($("layer"));
    S.layers.forEach(function (name, l) { var o = el("option", "", name); o.value = String(l); $("layer").appendChild(o); });
    clear($("heads"));
    S.heads.forEach(function (name, h) {
      var b = el("button", "head", String(h));
      b.type = "button"; b.title = name + ": " + S.stats["class"][0][h] + " in this layer? see Statistics";
      b.style.background = AK.headColor(h, 1);
      b.addEventListener("click", function (ev) {
        if (ev.shiftKey || ev.metaKey || ev.ctrlKey) state.heads[h] = !state.heads[h];
        else {
          var only = state.heads[h] && AK.heads().length === 1;
          for (var t = 0; t < nH; t++) state.heads[t] = only ? true : t === h;
        }
        AK.render();
      });
      $("heads").appendChild(b);
    });
    clear($("pair"));
    $("pair-box").hidden = S.pairStart === null;
    ["all", "AA", "AB", "BA", "BB"].forEach(function (f) {
      var b = el("button", "", f === "all" ? "all" : f.charAt(0) + "\u2192" + f.charAt(1));
      b.type = "button"; b.dataset.filter = f;
      b.addEventListener("click", function () { state.filter = f; state.zoom = 0; AK.render(); });
      $("pair").appendChild(b);
    });
    $("view-rollout").disabled = !S.rollout;
    $("view-neuron").disabled = !S.neuron;
    $("flow-box").hidden = true;
    var holds = S.mode === "dense" ? "This page holds every weight of " + nL + " layers \u00d7 " + nH +
      " heads (one byte each, within 1/510 of each head's largest)."
      : "Long input: for every head this page holds the max and the mean over " + S.block + "\u00d7" + S.block +
        "-token blocks (exact) and each query's top " + S.topk.k + " keys (exact); other weights are not stored.";
    $("holds").textContent = holds + " Statistics are exact (computed from every weight)." +
      (S.rollout ? " Rollout" + (S.flow ? " and flow" : "") + " from every layer." : "");
    AK.views.head.reset();
  }

  // ---- controls
  $("set").addEventListener("change", function () { state.set = +$("set").value; setupSet(); AK.render(); });
  $("layer").addEventListener("change", function () { state.layer = +$("layer").value; AK.render(); });
  VIEWS.forEach(function (v) {
    $("view-" + v).addEventListener("click", function () { state.view = v; state.zoom = 0; AK.render(); });
  });
  $("all-heads").addEventListener("click", function () { for (var t = 0; t < S.shape[1]; t++) state.heads[t] = true; AK.render(); });
  $("one-head").addEventListener("click", function () { for (var t = 0; t < S.shape[1]; t++) state.heads[t] = t === 0; AK.render(); });
  $("scale").addEventListener("change", function () { state.scale = $("scale").value; AK.render(); });
  $("open-in").addEventListener("change", function () { state.openIn = $("open-in").value; AK.render(); });
  $("overview").addEventListener("change", function () { state.overview = $("overview").value; AK.render(); });
  $("flow").addEventListener("change", function () { state.flow = $("flow").value; AK.render(); });
  $("combine").addEventListener("change", function () { state.combine = $("combine").value; AK.render(); });
  $("clear-sel").addEventListener("click", function () { state.sel = { axis: "q", items: [] }; state.pin = null; AK.render(); });

  // ---- state <-> address: read once, written back after every change
  var INT = /^\d+$/;
  function readHash() {
    var want = {};
    (location.hash || "").replace(/^#/, "").split("&").forEach(function (p) {
      var kv = p.split("=");
      if (kv[0]) want[kv[0]] = decodeURIComponent(kv[1] || "");
    });
    if (INT.test(want.set || "") && +want.set < D.sets.length) state.set = +want.set;
    setupSet();
    var init = D.initial || {};
    if (S.shape[2] * S.shape[3] > AK.LONG) state.view = "matrix";
    if (init.layer !== undefined) state.layer = init.layer;
    if (init.heads) for (var t = 0; t < S.shape[1]; t++) state.heads[t] = init.heads.indexOf(t) >= 0;
    if (VIEWS.indexOf(want.view) >= 0) state.view = want.view;
    if (INT.test(want.layer || "") && +want.layer < S.shape[0]) state.layer = +want.layer;
    if (want.heads) {
      var hs = want.heads.split(",").filter(function (x) { return INT.test(x) && +x < S.shape[1]; });
      if (hs.length) for (var t2 = 0; t2 < S.shape[1]; t2++) state.heads[t2] = hs.indexOf(String(t2)) >= 0;
    }
    if (INT.test(want.token || "") && +want.token < S.shape[2]) {
      state.pin = { axis: "q", i: +want.token }; state.sel = { axis: "q", items: [+want.token] };
    }
    if (want.sel) {
      var items = want.sel.replace(/^[qk]/, "").split(",").filter(function (x) { return INT.test(x); }).map(Number);
      state.sel = { axis: want.sel.charAt(0) === "k" ? "k" : "q", items: items };
    }
    if (["linear", "power", "log"].indexOf(want.scale) >= 0) state.scale = want.scale;
    if (S.pairStart !== null && ["all", "AA", "AB", "BA", "BB"].indexOf(want.filter) >= 0) state.filter = want.filter;
    if (INT.test(want.zoom || "")) state.zoom = Math.max(1, Math.min(40, +want.zoom));
    if (want.open === "head" || want.open === "matrix") state.openIn = want.open;
    if (S.genStart !== null && INT.test(want.step || "")) state.step = Math.max(1, Math.min(S.shape[2] - S.genStart, +want.step));
    if (INT.test(want.win || "")) state.win = +want.win;
    if ((state.view === "rollout" && !S.rollout) || (state.view === "neuron" && !S.neuron)) state.view = "matrix";
  }
  function writeHash() {
    var p = ["view=" + state.view, "layer=" + state.layer, "heads=" + AK.heads().join(","), "scale=" + state.scale];
    if (state.set) p.unshift("set=" + state.set);
    if (state.pin && state.pin.axis === "q") p.push("token=" + state.pin.i);
    else if (state.sel.items.length) p.push("sel=" + state.sel.axis + state.sel.items.join(","));
    if (state.filter !== "all") p.push("filter=" + state.filter);
    if (state.view === "matrix" || state.view === "rollout") p.push("zoom=" + state.zoom);
    if (state.view === "model") p.push("open=" + state.openIn);
    if (S.genStart !== null) p.push("step=" + state.step);
    if (state.win) p.push("win=" + state.win);
    var hash = "#" + p.join("&");
    if (location.hash !== hash && history.replaceState) history.replaceState(null, "", hash);
  }

  var HINTS = {
    head: "Hover a token to preview, click to pin it, shift-click to select several (their mean or sum shows below). " +
      "Keys: Tab to a token, Enter to pin, arrows to move. Line opacity = weight; one colour per head.",
    matrix: "Rows are queries, columns keys. Hover a cell for its value; click a row (or drag over rows, shift-click labels) " +
      "to select; zoom with the slider or ctrl + wheel.",
    model: "Every layer (rows) and head (columns), each on its own colour range. Click or press Enter to open one.",
    stats: "Click a column to sort; click a row to open that head. Classes: previous token, first token (sink), self, " +
      "local window (\u00b14), broad, mixed.",
    rollout: "Attention rollout (Abnar & Zuidema, 2020): row i shows how much of each input token reaches position i " +
      "through every layer, with the residual connection mixed in.",
    neuron: "For the first chosen head: q and k, and the per-dimension terms whose sum times the scale is the logit."
  };
  AK.render = function () {
    var t0 = performance.now();
    $("set").value = String(state.set); $("layer").value = String(state.layer); $("scale").value = state.scale;
    $("open-in").value = state.openIn; $("overview").value = state.overview; $("combine").value = state.combine;
    var hs = $("heads").children;
    for (var h = 0; h < hs.length; h++) hs[h].setAttribute("aria-pressed", String(state.heads[h]));
    var fs = $("pair").children;
    for (var f = 0; f < fs.length; f++) fs[f].setAttribute("aria-pressed", String(fs[f].dataset.filter === state.filter));
    VIEWS.forEach(function (v) {
      $("view-" + v).setAttribute("aria-pressed", String(state.view === v));
      var sec = $((v === "rollout" ? "matrix" : v) + "-view");
      if (v !== "rollout") sec.hidden = state.view !== v && !(v === "matrix" && state.view === "rollout");
    });
    $("zoom-box").hidden = state.view !== "matrix" && state.view !== "rollout";
    $("open-box").hidden = state.view !== "model";
    $("overview-box").hidden = true;
    $("flow-box").hidden = state.view !== "rollout" || !S.flow;
    $("hint").textContent = HINTS[state.view];
    AK.drawGeneration();
    var labels = [S.tokens, S.keyTokens];
    if (state.view === "head") AK.views.head.draw();
    else if (state.view === "matrix") AK.views.matrix.draw(S, state.layer, AK.heads(), AK.region(), { labels: labels, pairs: true });
    else if (state.view === "rollout") {
      var g = state.flow === "flow" && S.flow ? S.flow : S.rollout;
      AK.views.matrix.draw(g, 0, [0], AK.region(), { labels: labels, pairs: true });
    } else if (state.view === "model") AK.views.model.draw();
    else if (state.view === "stats") AK.views.stats.draw();
    else AK.views.neuron.draw();
    AK.drawSelection(state.view === "rollout" ? (state.flow === "flow" && S.flow ? S.flow : S.rollout) : S, labels);
    writeHash();
    document.body.dataset.renderMs = (performance.now() - t0).toFixed(0);
  };

  try {
    header();
    Promise.all(D.sets.map(AK.decodeSet)).then(function () {
      readHash();
      AK.render();
      document.body.dataset.readyMs = performance.now().toFixed(0);  // since navigation start
      document.body.dataset.ready = "1";
    }).catch(function (e) { AK.fail(String(e && e.message ? e.message : e)); });
  } catch (e) {
    AK.fail(String(e && e.message ? e.message : e));
    throw e;
  }
})(AK);
