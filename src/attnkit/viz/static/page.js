"use strict";
// attnkit's attention viewer, part 8: the sets and sides shown, the controls, and render(), which
// asks every view to draw the state and writes the state to the address.
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state, D = AK.D, VIEWS = AK.VIEWS, SUBTITLE = 240;
  var C = D.compare || null, KINDS = C ? C.kinds : D.sets.length;
  AK.compare = C;
  D.sets.forEach(function (s, i) {
    s.uid = i;
    s.sameKeys = s.shape[2] === s.shape[3] && s.tokens.every(function (t, j) { return t === s.keyTokens[j]; });
  });

  // ---- sets and sides: a comparison holds side A's kinds of attention, then side B's
  AK.kinds = function () { return KINDS; };
  function sideOf(name) {
    var b = name === "B";
    return { S: D.sets[(b ? KINDS : 0) + state.set], name: C ? name : "", label: C ? C.names[b ? 1 : 0] : "" };
  }
  AK.sides = function () {
    if (!C) return [sideOf("A")];
    return state.side === "both" ? [sideOf("A"), sideOf("B")] : [sideOf(state.side)];
  };
  AK.S = function () { return AK.sides()[0].S; };
  AK.diff = function () { return C && state.side === "both" ? C.diffs[state.set] : null; };
  AK.most = function (dim) {  // the most layers (0) or heads (1) of the sets of this kind
    return Math.max(sideOf("A").S.shape[dim], C ? sideOf("B").S.shape[dim] : 0);
  };
  AK.heads = function (S) {
    var n = (S || AK.S()).shape[1], out = [];
    for (var h = 0; h < n; h++) if (state.heads[h]) out.push(h);
    return out;
  };
  // Why a side cannot show the chosen layer and heads ("" when it can).
  AK.missing = function (S) {
    var who = C ? "Side " + (S === sideOf("B").S ? "B" : "A") : "This model";
    if (state.layer >= S.shape[0]) return who + " has " + S.shape[0] + " layers: no layer " + state.layer + " to show.";
    if (!AK.heads(S).length) return who + " has " + S.shape[1] + " heads: none of the chosen ones.";
    return "";
  };
  // Rows [r0, r1) and columns [c0, c1) shown: the sentence-pair filter, and the generation step.
  AK.region = function (S) {
    S = S || AK.S();
    var Q = S.shape[2], K = S.shape[3], r = [0, Q, 0, K];
    if (S.pairStart !== null && state.filter !== "all") {
      var qa = state.filter.charAt(0) === "A", ka = state.filter.charAt(1) === "A";
      r = [qa ? 0 : S.pairStart, qa ? S.pairStart : Q, ka ? 0 : S.pairKeyStart, ka ? S.pairKeyStart : K];
    }
    if (S.genStart !== null) { var end = Math.min(Q, S.genStart + state.step); r = [0, end, 0, Math.min(K, end)]; }
    return r;
  };
  AK.rawOf = function (S, axis, i) {
    var raw = axis === "q" ? S.rawTokens : S.rawKeyTokens, shown = axis === "q" ? S.tokens : S.keyTokens;
    return JSON.stringify(raw ? raw[i] : shown[i]);
  };
  // The panels of a view: the first is in the page; a comparison's other sides get copies of it.
  AK.panelRoots = function (box, n) {
    while (box.children.length < n) {
      var copy = box.children[0].cloneNode(true);
      copy.removeAttribute("id");
      Array.prototype.forEach.call(copy.querySelectorAll("[id]"), function (x) { x.removeAttribute("id"); });
      box.appendChild(copy);
    }
    for (var i = 0; i < box.children.length; i++) box.children[i].hidden = i >= n;
    return Array.prototype.slice.call(box.children, 0, n);
  };
  AK.sideName = function (node, side) {
    node.hidden = !side.name;
    node.textContent = side.name ? side.name + ": " + side.label : "";
  };
  AK.headColor = function (h, alpha) {
    return "hsla(" + ((h * 360 / AK.most(1) + 8) % 360).toFixed(0) + ", 70%, " + (AK.dark ? 62 : 45) + "%, " + alpha + ")";
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
    for (var t = 0; t < state.heads.length; t++) state.heads[t] = t === h;
    state.view = view; state.zoom = 0;
    AK.render();
  };
  AK.describeView = function () {
    var S = AK.S(), hs = AK.heads(S), l = Math.min(state.layer, S.shape[0] - 1);
    return state.view + " view, " + S.name + ", " + S.layers[l] + ", " + (hs.length === 1 ? S.heads[hs[0]] : hs.length + " heads") +
      (C ? ", " + AK.sides().map(function (s) { return s.name + ": " + s.label; }).join(" vs ") : "");
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
    for (var i = 0; i < KINDS; i++) { var o = el("option", "", D.sets[i].name); o.value = String(i); $("set").appendChild(o); }
    $("set-box").hidden = KINDS < 2;
    if (!C) return;
    $("compare-note").hidden = false;
    $("compare-note").textContent = "Comparing A: " + C.names[0] + " with B: " + C.names[1] + ". Both sides show the same " +
      "layer, heads, selected token and search. " + (C.why ? "Side by side only: " + C.why : "The matrix and rollout views add A \u2212 B " +
      "(orange: A attends more, blue: B does), made from the exact weights.");
    $("side-box").hidden = false;
    [["both", "A and B"], ["A", "A"], ["B", "B"]].forEach(function (s) {
      var b = el("button", "", s[1]);
      b.type = "button"; b.dataset.side = s[0];
      b.addEventListener("click", function () { state.side = s[0]; setupSet(); AK.render(); });
      $("sides").appendChild(b);
    });
  }
  function setupSet() {
    var S = AK.S(), nL = AK.most(0), nH = AK.most(1);
    var wide = [sideOf("A").S].concat(C ? [sideOf("B").S] : []);
    var byLayers = wide.reduce(function (a, b) { return b.shape[0] > a.shape[0] ? b : a; });
    var byHeads = wide.reduce(function (a, b) { return b.shape[1] > a.shape[1] ? b : a; });
    state.layer = Math.min(state.layer, nL - 1);
    if (state.heads.length !== nH) { state.heads = []; for (var h = 0; h < nH; h++) state.heads.push(true); }
    if (S.pairStart === null) state.filter = "all";
    if (S.genStart !== null) state.step = state.step || S.shape[2] - S.genStart;
    state.sel = { axis: "q", items: [] }; state.pin = null; state.center = null; state.zoom = 0; state.at = null;
    clear($("layer"));
    byLayers.layers.forEach(function (name, l) { var o = el("option", "", name); o.value = String(l); $("layer").appendChild(o); });
    clear($("heads"));
    byHeads.heads.forEach(function (name, h) {
      var b = el("button", "head", String(h));
      b.type = "button"; b.title = name + ": " + byHeads.stats["class"][0][h] + " in this layer? see Statistics";
      b.style.background = AK.headColor(h, 1);
      b.addEventListener("click", function (ev) {
        if (ev.shiftKey || ev.metaKey || ev.ctrlKey) state.heads[h] = !state.heads[h];
        else {
          var only = state.heads[h] && AK.heads(byHeads).length === 1;
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
    $("view-rollout").disabled = !wide.some(function (s) { return s.rollout; });
    $("view-neuron").disabled = !wide.some(function (s) { return s.neuron; });
    $("flow-box").hidden = true;
    var holds = S.mode === "dense" ? "This page holds every weight of " + S.shape[0] + " layers \u00d7 " + S.shape[1] +
      " heads (one byte each, within 1/510 of each head's largest)."
      : "Long input: for every head this page holds the max and the mean over " + S.block + "\u00d7" + S.block +
        "-token blocks (exact) and each query's top " + S.topk.k + " keys (exact); other weights are not stored.";
    $("holds").textContent = holds + " Statistics are exact (computed from every weight)." +
      (S.rollout ? " Rollout" + (S.flow ? " and flow" : "") + " from every layer." : "");
    AK.views.head.reset();
  }
  AK.setupSet = setupSet;

  // ---- controls: each changes the state, then everything is drawn again
  $("set").addEventListener("change", function () { state.set = +$("set").value; setupSet(); AK.render(); });
  $("layer").addEventListener("change", function () { state.layer = +$("layer").value; AK.render(); });
  VIEWS.forEach(function (v) {
    $("view-" + v).addEventListener("click", function () { state.view = v; state.zoom = 0; AK.render(); });
  });
  $("all-heads").addEventListener("click", function () { for (var t = 0; t < state.heads.length; t++) state.heads[t] = true; AK.render(); });
  $("one-head").addEventListener("click", function () { for (var t = 0; t < state.heads.length; t++) state.heads[t] = t === 0; AK.render(); });
  $("scale").addEventListener("change", function () { state.scale = $("scale").value; AK.render(); });
  $("open-in").addEventListener("change", function () { state.openIn = $("open-in").value; AK.render(); });
  $("overview").addEventListener("change", function () { state.overview = $("overview").value; AK.render(); });
  $("flow").addEventListener("change", function () { state.flow = $("flow").value; AK.render(); });
  $("combine").addEventListener("change", function () { state.combine = $("combine").value; AK.render(); });
  $("clear-sel").addEventListener("click", function () { state.sel = { axis: "q", items: [] }; state.pin = null; AK.render(); });

  var HINTS = {
    head: "Hover a token to preview, click to pin it, shift-click to select several (their mean or sum shows below). " +
      "Keys: Tab to a token, Enter to pin, arrows to move; / to find a token. Line opacity = weight; one colour per head.",
    matrix: "Rows are queries, columns keys. Hover a cell for its value; click a row (or drag over rows, shift-click labels) " +
      "to select; zoom with the slider or ctrl + wheel.",
    model: "Every layer (rows) and head (columns), each on its own colour range. Click or press Enter to open one.",
    stats: "Click a column to sort; click a row to open that head. Classes: previous token, first token (sink), self, " +
      "local window (\u00b14), broad, mixed.",
    rollout: "Attention rollout (Abnar & Zuidema, 2020): row i shows how much of each input token reaches position i " +
      "through every layer, with the residual connection mixed in.",
    neuron: "For the first chosen head: q and k, and the per-dimension terms whose sum times the scale is the logit.",
    image: "The picture the model saw, its patches coloured by the chosen heads' attention from the first non-patch token; " +
      "click a patch to look from it (shift-click adds), or a head's map to choose it. The rollout tab traces the whole stack.",
    explain: "Which input tokens the target depends on (hover a token for its score), each head's importance (click a " +
      "head to choose it in the other views) and, for attention \u00d7 gradient and rollout, the whole relevance matrix."
  };
  // What the matrix, rollout and selection strips draw: one item per side, and A - B.
  function matrixItems(sides) {
    var roll = state.view === "rollout", diff = AK.diff(), items = sides.map(function (side) {
      var S = side.S, g = roll ? (state.flow === "flow" && S.flow ? S.flow : S.rollout) : S;
      return { side: side, g: g, layer: roll ? 0 : state.layer, heads: roll ? [0] : AK.heads(S),
               absent: roll ? (g ? "" : (side.name || "This page") + " has no rollout.") : AK.missing(S) };
    });
    if (C && state.side === "both") {
      var A = sides[0].S, d = diff && (roll ? (state.flow === "flow" ? null : diff.rollout) : diff);
      var why = d ? "" : C.why || (roll ? (state.flow === "flow" ? "The difference is of the rollout, not the flow."
        : "The sides' rollouts cannot be subtracted (one is missing or too long).") : "");
      items.push({ side: { S: A, name: "A \u2212 B", label: "difference" }, g: d || null, layer: items[0].layer,
                   heads: items[0].heads, signed: true, absent: why || (d ? items[0].absent : "No difference to show.") });
    }
    return items;
  }
  AK.render = function () {
    var t0 = performance.now(), S = AK.S(), sides = AK.sides();
    $("set").value = String(state.set); $("layer").value = String(state.layer); $("scale").value = state.scale;
    $("open-in").value = state.openIn; $("overview").value = state.overview; $("combine").value = state.combine;
    $("flow").value = state.flow;
    var hs = $("heads").children;
    for (var h = 0; h < hs.length; h++) hs[h].setAttribute("aria-pressed", String(!!state.heads[h]));
    var fs = $("pair").children;
    for (var f = 0; f < fs.length; f++) fs[f].setAttribute("aria-pressed", String(fs[f].dataset.filter === state.filter));
    var ss = $("sides").children;
    for (var s = 0; s < ss.length; s++) ss[s].setAttribute("aria-pressed", String(ss[s].dataset.side === state.side));
    VIEWS.forEach(function (v) {
      $("view-" + v).setAttribute("aria-pressed", String(state.view === v));
      if (v !== "rollout") $(v + "-view").hidden = state.view !== v && !(v === "matrix" && state.view === "rollout");
    });
    $("zoom-box").hidden = state.view !== "matrix" && state.view !== "rollout";
    $("open-box").hidden = state.view !== "model";
    $("overview-box").hidden = !((state.view === "matrix" || state.view === "rollout") && S.mode === "long");
    $("flow-box").hidden = state.view !== "rollout" || !S.flow;
    $("hint").textContent = HINTS[state.view];
    AK.syncSearch();
    AK.drawGeneration();
    var items = matrixItems(sides);
    if (state.view === "head") AK.views.head.draw(sides);
    else if (state.view === "matrix" || state.view === "rollout") AK.views.matrix.draw(items, { pairs: true });
    else AK.views[state.view].draw(sides);
    AK.drawSelection(items.filter(function (it) { return !it.signed || (it.g && it.g.mode === "dense"); }));
    AK.toAddress();
    document.body.dataset.renderMs = (performance.now() - t0).toFixed(0);
  };

  try {
    header();
    var jobs = D.sets.map(AK.decodeSet).concat(C ? C.diffs.map(AK.decodeDiff) : []);
    if (D.explain) jobs.push(AK.decodeExplain());
    Promise.all(jobs).then(function () {
      AK.fromAddress();
      AK.render();
      document.body.dataset.readyMs = performance.now().toFixed(0);  // since navigation start
      document.body.dataset.ready = "1";
    }).catch(function (e) { AK.fail(String(e && e.message ? e.message : e)); });
  } catch (e) {
    AK.fail(String(e && e.message ? e.message : e));
    throw e;
  }
})(AK);
