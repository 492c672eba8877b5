"use strict";
// attnkit's attention viewer, part 2: the state and the address that holds it.
// The state says what is shown; each view reads it and draws. Controls, clicks and the search
// only change it and call AK.render(), which draws every view and writes the state back to the
// address, so a link reproduces the view (and editing the address changes it).
(function (AK) {
  var D = AK.D, INT = /^\d+$/;
  var VIEWS = ["head", "matrix", "model", "stats", "rollout", "neuron", "image", "explain"];
  var state = {
    set: 0, side: "both", view: "head", layer: 0, heads: [], pin: null, sel: { axis: "q", items: [] },
    find: "", whole: false, at: null,  // the search: text, whole tokens only, the current match
    win: 0, center: null, zoom: 0,     // the head view's first token, a long matrix's centre, px per token
    combine: "mean", scale: D.scale || "linear", filter: "all", openIn: "matrix", overview: "max",
    flow: "rollout", step: 0, nq: null, nk: null,
    img: "attention",                  // the image view: "attention" or "rollout" over the picture
    hover: null, sort: { key: null, dir: 1 }  // passing: not in the address
  };
  AK.state = state; AK.VIEWS = VIEWS;

  function parse(hash) {
    var want = {};
    (hash || "").replace(/^#/, "").split("&").forEach(function (p) {
      var at = p.indexOf("="), key = at < 0 ? p : p.slice(0, at);
      if (!key) return;
      try { want[key] = decodeURIComponent(at < 0 ? "" : p.slice(at + 1)); } catch (e) { want[key] = ""; }
    });
    return want;
  }
  function ints(text) {
    return text.split(",").filter(function (x) { return INT.test(x); }).map(Number);
  }
  function axisItem(text, nq, nk) {  // "17" (a query) or "k5" (a key)
    var m = /^([qk]?)(\d+)$/.exec(text || "");
    if (!m) return null;
    var axis = m[1] === "k" ? "k" : "q", i = +m[2];
    return i < (axis === "q" ? nq : nk) ? { axis: axis, i: i } : null;
  }

  // Where the address lives. A notebook shows the page in an about:srcdoc or sandboxed frame,
  // whose history.replaceState throws: the first write that fails moves the address into memory
  // for good (the state itself stays the one object above), so every view works there too.
  var inMemory = false, memory = "";
  function currentHash() {
    if (inMemory) return memory;
    try { return location.hash; } catch (e) { inMemory = true; return memory; }
  }
  function writeHash(hash) {
    if (!inMemory) {
      try {
        if (location.hash !== hash) history.replaceState(null, "", hash);
        return;
      } catch (e) { inMemory = true; }
    }
    memory = hash;
  }
  AK.address = currentHash;  // "#view=...&layer=..." wherever it is kept

  // The state from the address (anything missing or invalid keeps its default).
  AK.fromAddress = function () {
    var want = parse(currentHash());
    state.set = INT.test(want.set || "") && +want.set < AK.kinds() ? +want.set : 0;
    state.side = AK.compare && ["A", "B"].indexOf(want.side) >= 0 ? want.side : "both";
    state.win = 0; state.nq = null; state.nk = null; state.filter = "all"; state.combine = "mean";
    state.overview = "max"; state.flow = "rollout"; state.view = "head"; state.img = "attention";
    AK.setupSet();
    var S = AK.S(), Q = S.shape[2], K = S.shape[3], nL = AK.most(0), nH = AK.most(1), init = D.initial || {};
    if (Q * K > AK.LONG) state.view = "matrix";
    if (D.image) state.view = "image";  // an image source opens on its picture
    else if (D.explain) state.view = "explain";  // a page made with --explain opens on it
    if (init.layer !== undefined) state.layer = init.layer;
    if (init.heads) for (var t = 0; t < nH; t++) state.heads[t] = init.heads.indexOf(t) >= 0;
    if (VIEWS.indexOf(want.view) >= 0) state.view = want.view;
    if (INT.test(want.layer || "") && +want.layer < nL) state.layer = +want.layer;
    if (want.heads) {
      var hs = ints(want.heads).filter(function (h) { return h < nH; });
      if (hs.length) for (var t2 = 0; t2 < nH; t2++) state.heads[t2] = hs.indexOf(t2) >= 0;
    }
    if (INT.test(want.token || "") && +want.token < Q) {
      state.pin = { axis: "q", i: +want.token }; state.sel = { axis: "q", items: [+want.token] };
    }
    if (want.sel) {
      var axis = want.sel.charAt(0) === "k" ? "k" : "q", n = axis === "q" ? Q : K;
      state.sel = { axis: axis, items: ints(want.sel.replace(/^[qk]/, "")).filter(function (i) { return i < n; }) };
    }
    if (["linear", "power", "log"].indexOf(want.scale) >= 0) state.scale = want.scale;
    if (S.pairStart !== null && ["all", "AA", "AB", "BA", "BB"].indexOf(want.filter) >= 0) state.filter = want.filter;
    if (INT.test(want.zoom || "")) state.zoom = Math.min(40, +want.zoom);
    if (want.open === "head" || want.open === "matrix") state.openIn = want.open;
    if (S.genStart !== null && INT.test(want.step || "")) state.step = Math.max(1, Math.min(Q - S.genStart, +want.step));
    if (INT.test(want.win || "")) state.win = +want.win;
    var ctr = ints(want.ctr || "");
    if (ctr.length === 2) state.center = [Math.min(ctr[0], Q - 1), Math.min(ctr[1], K - 1)];
    state.find = (want.find || "").slice(0, 200);
    state.whole = want.whole === "1";
    state.at = axisItem(want.at, Q, K);
    if (INT.test(want.nq || "") && +want.nq < Q) state.nq = +want.nq;
    if (INT.test(want.nk || "") && +want.nk < K) state.nk = +want.nk;
    if (want.combine === "sum" || want.combine === "mean") state.combine = want.combine;
    if (want.ov === "max" || want.ov === "mean") state.overview = want.ov;
    if (want.flow === "flow" && S.flow) state.flow = "flow";
    if (want.img === "rollout" && S.rollout) state.img = "rollout";
    if (state.view === "image" && !D.image) state.view = "head";
    if (state.view === "explain" && !D.explain) state.view = "head";
    if ((state.view === "rollout" && !S.rollout) || (state.view === "neuron" && !S.neuron)) state.view = "matrix";
  };

  // The state as an address; written back (without a new history entry) after every change.
  AK.toAddress = function () {
    var S = AK.S(), p = ["view=" + state.view, "layer=" + state.layer, "heads=" + AK.heads().join(","),
                         "scale=" + state.scale];
    if (AK.compare && state.side !== "both") p.unshift("side=" + state.side);
    if (state.set) p.unshift("set=" + state.set);
    if (state.pin && state.pin.axis === "q") p.push("token=" + state.pin.i);
    else if (state.sel.items.length) p.push("sel=" + state.sel.axis + state.sel.items.join(","));
    if (state.filter !== "all") p.push("filter=" + state.filter);
    if (state.view === "matrix" || state.view === "rollout") p.push("zoom=" + state.zoom);
    if (state.center) p.push("ctr=" + state.center.join(","));
    if (state.view === "model") p.push("open=" + state.openIn);
    if (S.genStart !== null) p.push("step=" + state.step);
    if (state.win) p.push("win=" + state.win);
    if (state.find) p.push("find=" + encodeURIComponent(state.find));
    if (state.whole) p.push("whole=1");
    if (state.at) p.push("at=" + (state.at.axis === "k" ? "k" : "") + state.at.i);
    if (state.view === "neuron" && state.nq !== null) p.push("nq=" + state.nq);
    if (state.view === "neuron" && state.nk !== null) p.push("nk=" + state.nk);
    if (state.combine !== "mean") p.push("combine=" + state.combine);
    if (state.overview !== "max") p.push("ov=" + state.overview);
    if (state.flow !== "rollout") p.push("flow=" + state.flow);
    if (state.img !== "attention") p.push("img=" + state.img);
    writeHash("#" + p.join("&"));
  };
  // An address typed or pasted into the bar: read it again and draw.
  window.addEventListener("hashchange", function () {
    if (document.body.dataset.ready !== "1") return;
    AK.fromAddress();
    AK.render();
  });
})(AK);
