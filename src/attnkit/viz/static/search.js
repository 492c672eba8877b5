"use strict";
// attnkit's attention viewer, part 6: finding tokens. The search only changes the state (what to
// find, the current match, the windows that show it); the views mark every match and follow.
(function (AK) {
  var $ = AK.$, state = AK.state, cache = {};

  // Which tokens of a set match: {q: Uint8Array(Q), k: Uint8Array(K), list: [{axis, i}] in order}.
  // Substring (case-insensitive; a leading space in the text finds tokens that start a word), or
  // the whole token (without its leading space).
  AK.matches = function (S) {
    var key = state.find + "\u0000" + state.whole, hit = cache[S.uid];
    if (hit && hit.key === key) return hit;
    var Q = S.shape[2], K = S.shape[3], out = { key: key, q: new Uint8Array(Q), k: new Uint8Array(K), list: [] };
    var f = state.find.toLowerCase(), whole = state.whole, bare = f.trim();
    cache[S.uid] = out;
    if (!bare) return out;
    function test(t) { t = t.toLowerCase(); return whole ? t.trim() === bare : t.indexOf(f) >= 0; }
    for (var i = 0; i < Q; i++) if (test(S.tokens[i])) { out.q[i] = 1; out.list.push({ axis: "q", i: i }); }
    if (S.sameKeys) { out.k = out.q; return out; }
    for (var j = 0; j < K; j++) if (test(S.keyTokens[j])) { out.k[j] = 1; out.list.push({ axis: "k", i: j }); }
    return out;
  };

  // Make position i (a query, or a key) the current one: every view shows and selects it.
  AK.jump = function (m) {
    var S = AK.S(), Q = S.shape[2], K = S.shape[3], half = AK.views.head.WIN >> 1;
    state.at = { axis: m.axis, i: m.i };
    state.pin = { axis: m.axis, i: m.i }; state.sel = { axis: m.axis, items: [m.i] };
    state.nq = null; state.nk = null; state.hover = null;
    if (m.axis === "q") {
      state.win = Math.max(0, m.i - half);
      state.center = [m.i, S.sameKeys ? m.i : (state.center ? state.center[1] : 0)];
      if (S.genStart !== null && m.i >= S.genStart + state.step) state.step = m.i - S.genStart + 1;
    } else {
      state.win = Math.max(0, Math.round(m.i * Q / K) - half);
      state.center = [state.center ? state.center[0] : 0, m.i];
    }
    var reg = AK.region(S), inside = m.axis === "q" ? m.i >= reg[0] && m.i < reg[1] : m.i >= reg[2] && m.i < reg[3];
    if (!inside) state.filter = "all";
    if (state.view === "model" || state.view === "stats") state.view = Q * K > AK.LONG ? "matrix" : "head";
    AK.render();
  };
  function rank(S, m) { return (m.axis === "k" ? S.shape[2] : 0) + m.i; }
  function next(dir) {
    var S = AK.S(), list = AK.matches(S).list;
    if (!list.length) { AK.render(); return; }
    var from = state.at ? rank(S, state.at) : state.pin ? rank(S, state.pin) : -1, pick = null;
    if (dir > 0) {
      for (var a = 0; a < list.length && !pick; a++) if (rank(S, list[a]) > from) pick = list[a];
      pick = pick || list[0];
    } else {
      for (var b = list.length - 1; b >= 0 && !pick; b--) if (from < 0 || rank(S, list[b]) < from) pick = list[b];
      pick = pick || list[list.length - 1];
    }
    AK.jump(pick);
  }
  function goTo() {
    var S = AK.S(), Q = S.shape[2], text = $("goto").value.trim();
    if (!/^\d+$/.test(text)) { $("find-count").textContent = "Go to: a token number, 0 to " + (Q - 1); return; }
    if (+text >= Q) { $("find-count").textContent = "no token #" + text + ": the input has " + Q + " (#0\u2013#" + (Q - 1) + ")"; return; }
    AK.jump({ axis: "q", i: +text });
  }

  // The controls show the state.
  AK.syncSearch = function () {
    var S = AK.S(), found = AK.matches(S), n = found.list.length, at = state.at;
    if ($("find").value !== state.find) $("find").value = state.find;
    $("find-mode").value = state.whole ? "whole" : "sub";
    var k = -1;
    if (at) for (var i = 0; i < n; i++) if (found.list[i].axis === at.axis && found.list[i].i === at.i) k = i;
    var text = !state.find.trim() ? (at ? "at #" + at.i + " " + AK.plain((at.axis === "q" ? S.tokens : S.keyTokens)[at.i]) : "")
      : n === 0 ? "no match" : (k >= 0 ? "match " + (k + 1) + " of " + n : n + (n === 1 ? " match" : " matches")) +
        (n ? " (Enter: next, shift+Enter: previous)" : "");
    var sides = AK.sides();
    if (sides.length > 1 && state.find.trim() && !AK.diff()) {  // different tokens: each side's count
      text = sides.map(function (s) { return s.name + ": " + AK.matches(s.S).list.length; }).join(", ") + " matches; " + text;
    }
    $("find-count").textContent = text;
    $("find-prev").disabled = $("find-next").disabled = !n;
  };

  $("find").addEventListener("input", function () { state.find = $("find").value.slice(0, 200); AK.render(); });
  $("find").addEventListener("keydown", function (ev) {
    if (ev.key === "Enter") { ev.preventDefault(); state.find = $("find").value.slice(0, 200); next(ev.shiftKey ? -1 : 1); }
    else if (ev.key === "Escape") { state.find = ""; state.at = null; AK.render(); }
  });
  $("find-mode").addEventListener("change", function () { state.whole = $("find-mode").value === "whole"; AK.render(); });
  $("find-next").addEventListener("click", function () { next(1); });
  $("find-prev").addEventListener("click", function () { next(-1); });
  $("goto").addEventListener("keydown", function (ev) { if (ev.key === "Enter") { ev.preventDefault(); goTo(); } });
  $("goto").addEventListener("change", goTo);
  // "/" puts the cursor in the search box from anywhere but a text field.
  document.addEventListener("keydown", function (ev) {
    var tag = (ev.target.tagName || "").toLowerCase();
    if (ev.key !== "/" || tag === "input" || tag === "select" || tag === "textarea") return;
    ev.preventDefault();
    $("find").focus();
  });
})(AK);
