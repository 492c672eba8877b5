"use strict";
// attnkit's attention viewer, part 4: the head view (queries left, keys right, lines), one panel
// per side of a comparison.
(function (AK) {
  var state = AK.state;
  var ROW = 24, WIN = 48, ALL = 64;  // inputs up to ALL tokens show whole; longer ones a window of WIN

  function windowOf(S) {
    var Q = S.shape[2], K = S.shape[3], reg = AK.region(S);
    if (S.genStart === null && Q <= ALL && K <= ALL) return [0, Q, 0, K];  // the pair filter dims
    if (reg[1] - reg[0] <= ALL && reg[3] - reg[2] <= ALL) return reg.slice();
    var q0 = Math.max(reg[0], Math.min(reg[1] - WIN, state.win));
    var k0 = Q === K ? q0 : Math.max(reg[2], Math.min(reg[3] - WIN, Math.round(q0 * K / Q)));
    return [q0, Math.min(reg[1], q0 + WIN), k0, Math.min(reg[3], k0 + WIN)];
  }
  function active() {
    var h = state.hover || state.pin;
    if (h) return { axis: h.axis, items: state.sel.items.length && state.sel.axis === h.axis &&
                    state.sel.items.indexOf(h.i) >= 0 ? state.sel.items : [h.i] };
    return state.sel.items.length ? state.sel : null;
  }
  function tokenOf(ev) {
    var t = ev.target.closest ? ev.target.closest(".tok") : null;
    return t ? { axis: t.dataset.axis, i: +t.dataset.i, node: t } : null;
  }

  function Panel(root) {
    var self = this;
    this.root = root; this.built = null; this.S = null;
    this.name = root.querySelector(".side-name");
    this.q = root.querySelector(".q-col"); this.k = root.querySelector(".k-col");
    this.canvas = root.querySelector(".head-cols canvas"); this.outside = root.querySelector(".outside");
    this.absent = root.querySelector(".absent");
    this.winBox = root.querySelector(".window-box"); this.winInput = this.winBox.querySelector("input");
    this.winText = this.winBox.querySelector(".window-text");
    [this.q, this.k].forEach(function (box) {
      box.addEventListener("pointerover", function (ev) {
        var t = tokenOf(ev);
        if (t && ev.pointerType === "mouse") { state.hover = { axis: t.axis, i: t.i }; view.redraw(); }
      });
      box.addEventListener("pointerout", function (ev) {
        if (state.hover && ev.pointerType === "mouse") { state.hover = null; view.redraw(); }
      });
      box.addEventListener("click", function (ev) {
        var t = tokenOf(ev);
        if (!t) return;
        if (ev.shiftKey || ev.ctrlKey || ev.metaKey) { AK.toggleSel(t.axis, t.i); return; }
        var same = state.pin && state.pin.axis === t.axis && state.pin.i === t.i;
        state.pin = same ? null : { axis: t.axis, i: t.i };
        state.sel = same ? { axis: t.axis, items: [] } : { axis: t.axis, items: [t.i] };
        state.hover = null;
        AK.render();
      });
      box.addEventListener("keydown", function (ev) {
        var t = tokenOf(ev);
        if (!t || (ev.key !== "ArrowDown" && ev.key !== "ArrowUp")) return;
        ev.preventDefault();
        var next = ev.key === "ArrowDown" ? t.node.nextElementSibling : t.node.previousElementSibling;
        if (next) { next.focus(); return; }
        state.win = Math.max(0, state.win + (ev.key === "ArrowDown" ? 8 : -8));
        AK.render();
      });
    });
    this.winInput.addEventListener("input", function () { state.win = +self.winInput.value; AK.render(); });
  }
  Panel.prototype.build = function (S, win) {
    var key = [S.uid, win.join(","), state.step].join("|");
    if (this.built === key) return;
    this.built = key;
    [[this.q, S.tokens, win[0], win[1], "q"], [this.k, S.keyTokens, win[2], win[3], "k"]].forEach(function (c) {
      var box = c[0];
      AK.clear(box);
      for (var i = c[2]; i < c[3]; i++) {
        var b = AK.tokenNode("button", "tok", c[1][i]);
        b.type = "button"; b.dataset.i = String(i); b.dataset.axis = c[4];
        b.setAttribute("role", "option");
        b.title = "#" + i + " " + AK.rawOf(S, c[4], i) + "  (click: pin; shift-click: add to the selection)";
        var pairAt = c[4] === "q" ? S.pairStart : S.pairKeyStart;
        if (pairAt !== null && i === pairAt) b.classList.add("divider");
        if (S.genStart !== null && i >= S.genStart) b.classList.add("gen");
        box.appendChild(b);
      }
    });
    var reg = AK.region(S);
    this.winBox.hidden = win[0] === reg[0] && win[1] === reg[1] && win[1] - win[0] <= ALL;
    this.winInput.max = String(Math.max(0, reg[1] - WIN));
    this.winInput.value = String(win[0]);
    this.winText.textContent = "queries " + win[0] + "\u2013" + (win[1] - 1) + " of " + S.shape[2];
  };
  Panel.prototype.draw = function (side) {
    var S = side.S, l = state.layer;
    this.S = S;
    AK.sideName(this.name, side);
    var missing = AK.missing(S);
    this.absent.hidden = !missing; this.absent.textContent = missing;
    this.root.querySelector(".head-cols").hidden = !!missing;
    if (missing) { this.outside.textContent = ""; return; }
    var win = windowOf(S), heads = AK.heads(S);
    this.build(S, win);
    var nq = win[1] - win[0], nk = win[3] - win[2];
    var canvas = this.canvas, ratio = window.devicePixelRatio || 1, width = 240;
    var height = Math.max(nq, nk) * ROW;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    var act = active(), outside = [];
    if (act && act.items.some(function (i) { return i >= (act.axis === "q" ? S.shape[2] : S.shape[3]); })) act = null;
    heads.forEach(function (h) {
      var paths = [];
      for (var b = 0; b < 8; b++) paths.push([]);
      for (var i = win[0]; i < win[1]; i++) {
        if (act && act.axis === "q" && act.items.indexOf(i) < 0) continue;
        var r = AK.row(S, l, h, i);
        if (!act) {  // nothing chosen: each query's strongest key only, thin
          var bj = -1, bv = 0.01;
          for (var j = win[2]; j < win[3]; j++) if (r.w[j] > bv) { bv = r.w[j]; bj = j; }
          if (bj >= 0) paths[Math.min(7, Math.floor(bv * 8))].push(i, bj);
          continue;
        }
        for (var j2 = 0; j2 < S.shape[3]; j2++) {
          var v = r.w[j2];
          if (v < 0.01 || (act.axis === "k" && act.items.indexOf(j2) < 0)) continue;
          if (j2 < win[2] || j2 >= win[3]) { if (act.axis === "q") outside.push([v, j2]); continue; }
          paths[Math.min(7, Math.floor(v * 8))].push(i, j2);
        }
      }
      ctx.lineWidth = act ? 2 : 1;
      for (var bb = 0; bb < 8; bb++) {
        var p = paths[bb];
        if (!p.length) continue;
        ctx.strokeStyle = AK.headColor(h, ((bb + 0.5) / 8 * (act ? 1 : 0.6)).toFixed(3));
        ctx.beginPath();
        for (var s = 0; s < p.length; s += 2) {
          ctx.moveTo(0, (p[s] - win[0]) * ROW + ROW / 2);
          ctx.lineTo(width, (p[s + 1] - win[2]) * ROW + ROW / 2);
        }
        ctx.stroke();
      }
    });
    // Token backgrounds: what the chosen queries give to each key, or what queries give the chosen keys.
    var qs = this.q.children, ks = this.k.children, how = state.combine;
    var toKeys = act && act.axis === "q" ? AK.combine(S, l, heads, act.items, how).w : null;
    var toQueries = act && act.axis === "k" ? AK.column(S, l, heads, act.items, how) : null;
    var mk = toKeys ? AK.maxOf(toKeys) : 0, mq = toQueries ? AK.maxOf(toQueries) : 0;
    var reg = AK.region(S), sel = state.sel, found = AK.matches(S), at = state.at;
    for (var a = 0; a < qs.length; a++) {
      var qi = win[0] + a;
      qs[a].style.background = toQueries ? AK.shade(toQueries[qi], mq) : "";
      qs[a].classList.toggle("active", !!act && act.axis === "q" && act.items.indexOf(qi) >= 0);
      qs[a].classList.toggle("selected", sel.axis === "q" && sel.items.indexOf(qi) >= 0);
      qs[a].classList.toggle("dim", qi < reg[0] || qi >= reg[1]);
      qs[a].classList.toggle("match", !!found.q[qi]);
      qs[a].classList.toggle("current", !!at && at.axis === "q" && at.i === qi);
      qs[a].setAttribute("aria-selected", String(sel.axis === "q" && sel.items.indexOf(qi) >= 0));
    }
    for (var c = 0; c < ks.length; c++) {
      var kj = win[2] + c;
      ks[c].style.background = toKeys ? AK.shade(toKeys[kj], mk) : "";
      ks[c].classList.toggle("active", !!act && act.axis === "k" && act.items.indexOf(kj) >= 0);
      ks[c].classList.toggle("selected", sel.axis === "k" && sel.items.indexOf(kj) >= 0);
      ks[c].classList.toggle("dim", kj < reg[2] || kj >= reg[3]);
      ks[c].classList.toggle("match", !!found.k[kj]);
      ks[c].classList.toggle("current", !!at && at.axis === "k" && at.i === kj);
    }
    outside.sort(function (x, y) { return y[0] - x[0]; });
    this.outside.textContent = outside.length ? "Outside the window: " + outside.slice(0, 6).map(function (o) {
      return "#" + o[1] + " " + AK.plain(S.keyTokens[o[1]]) + " " + AK.fmt(o[0]);
    }).join(",  ") + (outside.length > 6 ? ", \u2026" : "") : "";
  };

  var panels = [], last = [];
  var view = {
    ROW: ROW, WIN: WIN, ALL: ALL, windowOf: windowOf,
    panels: function () { return panels.slice(0, last.length); },
    draw: function (sides) {
      last = sides;
      var roots = AK.panelRoots(AK.$("head-panels"), sides.length);
      roots.forEach(function (root, i) {
        if (!panels[i] || panels[i].root !== root) panels[i] = new Panel(root);
        panels[i].draw(sides[i]);
      });
    },
    redraw: function () { view.draw(last); },
    reset: function () { panels.forEach(function (p) { p.built = null; }); }
  };
  AK.views.head = view;
})(AK);
