"use strict";
// attnkit's attention viewer, part 6: the image view. A vision transformer's tokens are a few
// non-patch tokens ([CLS], [DIST], registers) and then its patches, row by row; this view draws
// the chosen heads' attention from a token (the first non-patch token unless a token is chosen)
// as a heatmap over the picture the model saw, one small map per head of the layer, and the
// rollout. It reads the state (layer, heads, selected token, search) and only changes it.
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state, I = AK.D.image;
  $("view-image").hidden = !I;
  var view = { draw: function () {}, panels: function () { return []; } };
  AK.views.image = view;
  if (!I) return;
  var P = I.prefix.length, R = I.rows, C = I.cols, PH = I.patch[0], PW = I.patch[1];
  var MAIN = 448, THUMB = 112;  // px of the longer side of the picture and of each head's map
  var picture = new Image(), loaded = false, exact = { attn: null, roll: null }, waiting = 1, drawn = 0;
  function settled() {
    if (--waiting === 0 && document.body.dataset.ready === "1" && state.view === "image") AK.render();
  }
  picture.onload = function () { loaded = true; settled(); };
  picture.onerror = function () { AK.fail("the picture in the page cannot be decoded"); };
  picture.src = I.picture;
  // A long page keeps only each row's top-k; the non-patch tokens' rows come whole beside it.
  [["attn", I.prefixRows], ["roll", I.rolloutRows]].forEach(function (part) {
    if (!part[1]) return;
    waiting++;
    AK.decodeSet({ mode: "dense", encoding: part[1].encoding, data: part[1].data, scales: part[1].scales,
                   shape: part[1].shape }).then(function (g) { exact[part[0]] = g; settled(); })
      .catch(function (e) { AK.fail(String(e && e.message ? e.message : e)); });
  });

  function label(i) { return i < P ? I.prefix[i] : "p(" + Math.floor((i - P) / C) + "," + ((i - P) % C) + ")"; }
  // One query's row over every token: exact, or a long page's top-k (known marks the stored keys).
  function rowOf(S, rollout, l, h, i) {
    if (rollout) return i < P && exact.roll ? AK.row(exact.roll, 0, 0, i) : AK.row(S.rollout, 0, 0, i);
    return S.mode === "long" && i < P && exact.attn ? AK.row(exact.attn, l, h, i) : AK.row(S, l, h, i);
  }
  // Where the heatmap looks from: the chosen queries, the chosen keys (what each token gives them),
  // or by default the first non-patch token (all patches' mean when the model has none).
  function sourceOf(S) {
    var sel = state.pin ? { axis: state.pin.axis, items: [state.pin.i] } : state.sel.items.length ? state.sel : null;
    if (sel) return { axis: sel.axis, items: sel.items.slice(), auto: false };
    if (P) return { axis: "q", items: [0], auto: true };
    var all = [];
    for (var p = 0; p < R * C; p++) all.push(p);
    return { axis: "q", items: all, auto: true };
  }
  function describe(src) {
    var names = src.items.slice(0, 4).map(label).join(", ") + (src.items.length > 4 ? " and " + (src.items.length - 4) + " more" : "");
    if (src.axis === "k") return "what each token gives to " + names;
    if (src.auto && !P) return "from every patch (their mean; this model has no [CLS] token)";
    return "from " + names;
  }
  // The vector drawn: one value per token (keys, or queries for a chosen key); and whether any
  // value is unknown (a long page's row beyond its top-k).
  function vectorOf(S, rollout, l, heads, src) {
    var n = S.shape[3], out = new Float32Array(n), partial = false;
    if (src.axis === "k") {
      var g = rollout ? S.rollout : S, col = AK.column(g, rollout ? 0 : l, rollout ? [0] : heads, src.items, state.combine);
      return { v: col, partial: g.mode === "long" };
    }
    var hs = rollout ? [0] : heads;
    hs.forEach(function (h) {
      src.items.forEach(function (i) {
        var r = rowOf(S, rollout, l, h, i);
        if (r.known) partial = true;
        for (var j = 0; j < n; j++) out[j] += r.w[j];
      });
    });
    var div = state.combine === "sum" && !src.auto ? hs.length : hs.length * src.items.length;
    for (var j2 = 0; j2 < n; j2++) out[j2] /= div || 1;
    return { v: out, partial: partial };
  }
  // Heat over a picture: clear at 0, then dark red to yellow, more opaque as the value grows.
  function HOT(px, p, u) {
    px[4 * p] = Math.round(150 + 105 * Math.min(1, 2 * u)); px[4 * p + 1] = Math.round(230 * Math.max(0, u - 0.35) / 0.65);
    px[4 * p + 2] = Math.round(40 * Math.max(0, u - 0.8) / 0.2); px[4 * p + 3] = Math.round(255 * 0.8 * u);
  }
  function legend(cv) {
    var img = new ImageData(128, 1);
    for (var i = 0; i < 128; i++) HOT(img.data, i, i / 127);
    cv.width = 128; cv.height = 1; cv.getContext("2d").putImageData(img, 0, 0);
  }
  function patchMax(v) { var m = 0; for (var p = P; p < P + R * C; p++) if (v[p] > m) m = v[p]; return m; }
  // The picture with the patches' values over it, into a canvas of `side` px on its longer side.
  function paint(cv, v, side, marks) {
    var z = side / Math.max(I.width, I.height), w = Math.round(I.width * z), h = Math.round(I.height * z);
    var ratio = window.devicePixelRatio || 1;
    cv.width = Math.round(w * ratio); cv.height = Math.round(h * ratio);
    cv.style.width = w + "px"; cv.style.height = h + "px";
    var ctx = cv.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    if (loaded) ctx.drawImage(picture, 0, 0, w, h);
    var heat = el("canvas"), img = new ImageData(C, R), m = patchMax(v);
    heat.width = C; heat.height = R;
    for (var p = 0; p < R * C; p++) HOT(img.data, p, AK.toUnit(v[P + p], m, state.scale));
    heat.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(heat, 0, 0, C * PW * z, R * PH * z);
    (marks || []).forEach(function (mk) {
      var p2 = mk.i - P;
      if (p2 < 0 || p2 >= R * C) return;
      ctx.lineWidth = mk.width; ctx.strokeStyle = mk.color; ctx.setLineDash(mk.dash || []);
      ctx.strokeRect((p2 % C) * PW * z + 1, Math.floor(p2 / C) * PH * z + 1, PW * z - 2, PH * z - 2);
    });
    ctx.setLineDash([]);
    return z;
  }
  function patchAt(ev, cv, z) {
    var r = cv.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    var c = Math.floor(x / (PW * z)), row = Math.floor(y / (PH * z));
    return c >= 0 && c < C && row >= 0 && row < R ? P + row * C + c : -1;
  }

  var main = $("image-canvas"), zoom = 1, last = null, mark = getComputedStyle(document.body).getPropertyValue("--mark").trim() || "#c2410c";
  main.addEventListener("click", function (ev) {
    var i = patchAt(ev, main, zoom);
    if (i < 0) return;
    if (ev.shiftKey || ev.ctrlKey || ev.metaKey) { AK.toggleSel("q", i); return; }
    var same = state.pin && state.pin.axis === "q" && state.pin.i === i;
    state.pin = same ? null : { axis: "q", i: i };
    state.sel = { axis: "q", items: same ? [] : [i] };
    AK.render();
  });
  main.addEventListener("pointermove", function (ev) {
    var i = patchAt(ev, main, zoom);
    if (i < 0 || !last) { AK.hideTip(); return; }
    AK.tip(ev, "#" + i + " " + label(i) + "   " + AK.fmt(last.v[i]) + "  (click: look from this patch)");
  });
  main.addEventListener("pointerleave", AK.hideTip);
  Array.prototype.forEach.call($("image-show").children, function (b) {
    b.addEventListener("click", function () { state.img = b.dataset.show; AK.render(); });
  });

  function drawPrefix(S, v, src) {
    var box = $("image-prefix");
    clear(box);
    if (!P) { box.appendChild(el("span", "muted", "none: every token is a patch")); return; }
    var total = 0;
    for (var t = 0; t < P; t++) {
      var b = el("button", "small tok-chip", I.prefix[t] + "  " + AK.fmt(v[t]));
      b.type = "button"; b.dataset.i = String(t);
      b.title = "#" + t + " " + I.prefix[t] + ": not a patch. Click: look from it";
      if (src.axis === "q" && src.items.indexOf(t) >= 0) b.classList.add("current");
      if (AK.matches(S).q[t]) b.classList.add("match");
      b.addEventListener("click", function (ev) {
        var i = +ev.currentTarget.dataset.i;
        state.pin = { axis: "q", i: i }; state.sel = { axis: "q", items: [i] };
        AK.render();
      });
      box.appendChild(b);
      total += v[t];
    }
    box.appendChild(el("div", "muted", (src.axis === "k" ? "" : "Non-patch tokens take " + AK.fmt(total) +
      " of this attention; the patches " + AK.fmt(Math.max(0, 1 - total)) + ". ") +
      "The heatmap is scaled to the patches alone."));
  }
  function drawHeads(S, src, rollout) {
    var box = $("image-heads"), nH = S.shape[1], l = state.layer;
    $("image-heads-title").textContent = rollout ? "Rollout combines every layer and head (the residual mixed in); " +
      "the attention tab shows each head." : "Each head of " + S.layers[l] + ", " + describe(src) + " (click: only that head; shift-click: add it)";
    box.hidden = rollout;
    if (rollout) return;
    while (box.children.length < nH) {
      var fig = el("figure", "head-map"), cv = el("canvas");
      fig.appendChild(cv); fig.appendChild(el("figcaption"));
      fig.dataset.head = String(box.children.length);
      fig.addEventListener("click", function (ev) {
        var h = +ev.currentTarget.dataset.head;
        if (ev.shiftKey || ev.metaKey || ev.ctrlKey) state.heads[h] = !state.heads[h];
        else for (var t = 0; t < state.heads.length; t++) state.heads[t] = t === h;
        AK.render();
      });
      box.appendChild(fig);
    }
    for (var h = 0; h < box.children.length; h++) {
      var f = box.children[h];
      f.hidden = h >= nH;
      if (h >= nH) continue;
      var vh = vectorOf(S, false, l, [h], src);
      paint(f.querySelector("canvas"), vh.v, THUMB, []);
      f.querySelector("figcaption").textContent = S.heads[h] + "  max " + AK.fmt(patchMax(vh.v));
      f.classList.toggle("chosen", !!state.heads[h]);
    }
  }
  view.draw = function (sides) {
    var S = sides[0].S, missing = AK.missing(S), rollout = state.img === "rollout" && !!S.rollout;
    Array.prototype.forEach.call($("image-show").children, function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.show === (rollout ? "rollout" : "attention")));
      b.disabled = b.dataset.show === "rollout" && !S.rollout;
    });
    $("image-absent").hidden = !missing; $("image-absent").textContent = missing;
    $("image-body").hidden = !!missing;
    if (missing) return;
    var src = sourceOf(S), heads = AK.heads(S), got = vectorOf(S, rollout, state.layer, heads, src);
    var found = AK.matches(S), marks = [];
    for (var p = P; p < P + R * C; p++) if (found.q[p]) marks.push({ i: p, color: mark, width: 1, dash: [3, 2] });
    if (state.at && state.at.axis === "q") marks.push({ i: state.at.i, color: mark, width: 2 });
    if (src.axis === "q" && !src.auto) src.items.forEach(function (i) { marks.push({ i: i, color: "#fff", width: 3 }, { i: i, color: "#000", width: 1 }); });
    zoom = paint(main, got.v, MAIN, marks);
    last = got;
    var m = patchMax(got.v);
    $("image-from").textContent = (rollout ? "Rollout " : "Attention of " + (heads.length === 1 ? S.heads[heads[0]] :
      "the mean of " + heads.length + " heads") + " in " + S.layers[state.layer] + " ") + describe(src) +
      (src.auto && P ? " (click a patch to look from it, again to come back)" : "");
    legend($("image-legend"));
    $("image-scale").textContent = "Colour: 0 to " + AK.fmt(m) + " (" + state.scale + " scale), the largest value on a patch." +
      (got.partial ? " Long input: a patch's row holds only its top " + S.topk.k + " keys; the other patches show none." : "");
    drawPrefix(S, got.v, src);
    drawHeads(S, src, rollout);
    if (loaded && waiting === 0) main.dataset.drawn = String(++drawn);
  };
  // The view as SVG parts for "Save view": the picture with its heatmap, and each head's map.
  view.svg = function (image, text) {
    var w = parseFloat(main.style.width), h = parseFloat(main.style.height), y = 44;
    text(10, y - 6, $("image-from").textContent, 'font-size="12"');
    image(main, 10, y, w, h);
    var x = 10, top = y + h + 24, right = w + 20, bottom = top;
    Array.prototype.forEach.call($("image-heads").children, function (f) {
      if (f.hidden || $("image-heads").hidden) return;
      var cv = f.querySelector("canvas"), cw = parseFloat(cv.style.width), ch = parseFloat(cv.style.height);
      if (x + cw > 900) { x = 10; top = bottom + 24; }
      text(x, top - 4, f.querySelector("figcaption").textContent, 'font-size="11"');
      image(cv, x, top, cw, ch);
      x += cw + 12; right = Math.max(right, x); bottom = Math.max(bottom, top + ch);
    });
    return [right + 10, bottom + 20];
  };
})(AK);
