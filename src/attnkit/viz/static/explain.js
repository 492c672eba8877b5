"use strict";
// attnkit's attention viewer, part 6b: the Explain view (attnkit.viz.explain on the page's text).
// The tokens coloured by their relevance to the target on a diverging map (orange: for it, blue:
// against it); the head-importance grid (layers x heads), where a click selects that layer and
// head in the other views; the relevance matrix of attention x gradient and rollout. It reads the
// state (layer, heads, scale, generation step) and only changes it through a click on the grid or
// on a row of a generation's steps x sources matrix (which moves the step slider).
(function (AK) {
  var $ = AK.$, el = AK.el, clear = AK.clear, state = AK.state, E = AK.D.explain;
  $("view-explain").hidden = !E;
  var view = { draw: function () {}, panels: function () { return []; } };
  AK.views.explain = view;
  if (!E) return;
  var scores = null, heads = null, rel = null, steps = null, MAT = 520, NAN = AK.dark ? [31, 36, 45] : [238, 240, 244];
  var I = AK.D.image, picture = null;
  if (I) {  // a picture's page: the patches drawn on it, coloured by relevance
    picture = new Image();
    picture.onload = function () { if (document.body.dataset.ready === "1" && state.view === "explain") AK.render(); };
    picture.src = I.picture;
  }

  function floats(bytes) {  // little-endian float32 (every browser this page runs in is little-endian)
    var copy = bytes.slice();
    return new Float32Array(copy.buffer, 0, copy.length / 4);
  }
  // The relevance matrix: one signed byte a value off the diagonal, times its row's scale; the
  // diagonal exact.
  function signedRows(bytes, diagonal, part) {
    var codes = new Int8Array(bytes.buffer, bytes.byteOffset, bytes.length), C = part.shape[1];
    var out = new Float32Array(codes.length);
    for (var i = 0; i < codes.length; i++) out[i] = codes[i] * part.scales[Math.floor(i / C)];
    for (var d = 0; d < diagonal.length; d++) out[d * C + d] = diagonal[d];
    return out;
  }
  AK.decodeExplain = function () {
    if (E.generation) {  // each generated token the target: a steps x sources matrix
      return Promise.all([AK.unpack(E.matrix), E.heads ? AK.unpack(E.heads) : null]).then(function (p) {
        steps = floats(p[0]); heads = p[1] ? floats(p[1]) : null;
        if (steps.length !== E.matrix.shape[0] * E.matrix.shape[1]) throw new Error("the steps' relevance has the wrong size");
      });
    }
    var jobs = [AK.unpack(E.scores).then(function (b) { scores = floats(b); })];
    if (E.heads) jobs.push(AK.unpack(E.heads).then(function (b) { heads = floats(b); }));
    if (E.relevance) {
      jobs.push(Promise.all([AK.unpack(E.relevance), AK.unpack(E.relevance.diagonal)]).then(function (p) {
        rel = signedRows(p[0], floats(p[1]), E.relevance);
      }));
    }
    return Promise.all(jobs).then(function () {
      if (scores.length !== E.tokens.length) throw new Error("the relevance scores have the wrong size");
    });
  };
  // What is explained now: the one target, or the generated token the step slider is on.
  function current() {
    if (!E.generation) {
      return { tokens: E.tokens, scores: scores, heads: heads, pos: E.targetPosition, target: E.target, value: E.targetValue };
    }
    var N = E.matrix.shape[0], n1 = E.matrix.shape[1], t = Math.max(0, Math.min(N - 1, (state.step || N) - 1));
    var p = E.promptLength + t, per = heads ? E.heads.shape[1] * E.heads.shape[2] : 0;
    return { tokens: E.tokens.slice(0, p), scores: steps.subarray(t * n1, t * n1 + p), step: t, pos: p - 1,
             heads: heads ? heads.subarray(t * per, (t + 1) * per) : null, target: E.targets[t], value: E.values[t] };
  }
  function rgb(lut, t) {  // a colour of a ramp at t in [0, 1]
    var i = Math.round(255 * Math.max(0, Math.min(1, t))) * 3;
    return "rgb(" + lut[i] + ", " + lut[i + 1] + ", " + lut[i + 2] + ")";
  }
  function signedColour(v, m) { return rgb(AK.DLUT, 0.5 + 0.5 * AK.toSigned(v, m, state.scale)); }
  function sign(v) { return (v > 0 ? "+" : "") + AK.fmt(v); }

  // The colours' range: the largest |score|, leaving out the target's own position when the scores
  // are a row of R (which starts from the identity, so that position holds 1 + its relevance).
  function range(cur) {
    var skip = E.method === "attention_x_gradient" && cur.pos !== null ? cur.pos : null, m = 0, v = cur.scores;
    for (var i = 0; i < v.length; i++) if (i !== skip && Math.abs(v[i]) > m) m = Math.abs(v[i]);
    return { m: m || AK.absMaxOf(v), skip: skip };
  }
  function drawTokens(box, cur) {
    var r = range(cur), m = r.m, found = AK.matches(AK.S()), scores = cur.scores;
    box.appendChild(el("div", "pane-title", "Relevance of each token to the target (orange: for it, blue: against it; " +
      "colours reach " + AK.fmt(m) + (r.skip === null ? ", the largest |value|)" : ", the largest |value| but the target " +
      "position's own, which holds R's identity start)")));
    var line = el("div", "explain-tokens");
    cur.tokens.forEach(function (t, i) {
      var s = AK.tokenNode("span", "explain-tok" + (i === cur.pos ? " target" : "") + (found.q[i] ? " match" : ""), t);
      s.style.background = signedColour(scores[i], m);
      s.title = "#" + i + " " + JSON.stringify(t) + "  " + sign(scores[i]) + (i === cur.pos ? "  (the target's position)" : "");
      line.appendChild(s);
    });
    box.appendChild(line);
    var order = Array.prototype.slice.call(scores).map(function (v, i) { return [v, i]; })
      .sort(function (a, b) { return Math.abs(b[0]) - Math.abs(a[0]); }).slice(0, 8);
    box.appendChild(el("p", "muted", "most relevant: " + order.map(function (o) {
      return "#" + o[1] + " " + AK.plain(cur.tokens[o[1]]) + " " + sign(o[0]);
    }).join(",  ")));
  }

  function selectHead(l, h) {
    var pl = E.pageLayer[l], ph = E.pageHead[h];
    if (pl < 0 || ph < 0) return;
    state.layer = pl;
    for (var t = 0; t < state.heads.length; t++) state.heads[t] = t === ph;
    AK.render();
  }
  function drawHeads(box, cur) {
    var heads = cur.heads;
    if (!heads) { box.appendChild(el("p", "muted", "No head importance: " + E.method + " reads no gradients.")); return; }
    var sh = E.heads.shape, nL = sh[sh.length - 2], nH = sh[sh.length - 1], m = AK.maxOf(heads), chosen = AK.heads();
    box.appendChild(el("div", "pane-title", "Head importance |\u03a3 o \u2299 \u2202y/\u2202o| (Michel et al., 2019): " +
      "layers \u00d7 heads; click a head to choose it in the other views (largest " + AK.fmt(m) + ")"));
    var grid = el("div", "explain-heads");
    grid.style.gridTemplateColumns = "auto repeat(" + nH + ", 22px)";
    grid.appendChild(el("span", "col-label", ""));
    for (var h = 0; h < nH; h++) grid.appendChild(el("span", "col-label", String(h)));
    for (var l = 0; l < nL; l++) {
      grid.appendChild(el("span", "row-label", "layer " + l));
      for (var h2 = 0; h2 < nH; h2++) {
        var v = heads[l * nH + h2], on = E.pageLayer[l] >= 0 && E.pageHead[h2] >= 0;
        var cell = el("button", "explain-cell" + (on ? "" : " off"));
        cell.type = "button";
        cell.dataset.layer = String(l); cell.dataset.head = String(h2);
        cell.style.background = rgb(AK.LUT, AK.toUnit(v, m, state.scale));
        cell.title = "layer " + l + ", head " + h2 + ": " + AK.fmt(v) + (on ? "; click to choose it" : "; not on this page");
        cell.setAttribute("aria-pressed", String(on && E.pageLayer[l] === state.layer && chosen.length === 1 &&
                                                 chosen[0] === E.pageHead[h2]));
        cell.addEventListener("click", function (ev) {
          selectHead(+ev.currentTarget.dataset.layer, +ev.currentTarget.dataset.head);
        });
        grid.appendChild(cell);
      }
    }
    box.appendChild(grid);
  }

  function drawMatrix(box) {
    if (!rel) return;
    var R = E.relevance.shape[0], C = E.relevance.shape[1], vmax = 0;
    for (var i = 0; i < R; i++) for (var j = 0; j < C; j++) if (i !== j && Math.abs(rel[i * C + j]) > vmax) vmax = Math.abs(rel[i * C + j]);
    box.appendChild(el("div", "pane-title", (E.method === "rollout" ? "Rollout" : "Relevance R (Chefer et al., 2021)") +
      ": row i is what position i draws from each token (columns); the target's row gives the scores. Colours reach " +
      "the largest |value| off the diagonal (" + AK.fmt(vmax) + "); off the diagonal each row is stored within 1/254 of " +
      "its largest."));
    var cv = el("canvas", "explain-matrix"), img = new ImageData(C, R);
    cv.width = C; cv.height = R;
    var px = Math.max(1, Math.min(24, Math.floor(MAT / Math.max(R, C))));
    cv.style.width = (C * px > MAT ? MAT : C * px) + "px"; cv.style.height = (R * px > MAT ? MAT * R / C : R * px) + "px";
    for (var p = 0; p < R * C; p++) AK.paint(img.data, p, AK.toUnit(Math.abs(rel[p]), vmax, state.scale));
    cv.getContext("2d").putImageData(img, 0, 0);
    cv.addEventListener("pointermove", function (ev) {
      var r = cv.getBoundingClientRect(), x = Math.floor((ev.clientX - r.left) / r.width * C), y = Math.floor((ev.clientY - r.top) / r.height * R);
      if (x >= 0 && x < C && y >= 0 && y < R) AK.tip(ev, "#" + y + " " + AK.plain(E.tokens[y]) + " \u2190 #" + x + " " + AK.plain(E.tokens[x]) + "   " + AK.fmt(rel[y * C + x]));
    });
    cv.addEventListener("pointerleave", AK.hideTip);
    box.appendChild(cv);
  }

  // A generation's steps x sources matrix: row t, the relevance of each earlier token to generated
  // token t, each row on its own colour range (as drawTokens, without the identity's +1); a click
  // on a row moves the step slider there.
  function drawSteps(box, cur) {
    var N = E.matrix.shape[0], C = E.matrix.shape[1], L = E.promptLength;
    var px = Math.max(1, Math.min(16, Math.floor(MAT / Math.max(N, C)))), cv = el("canvas", "explain-matrix explain-steps");
    box.appendChild(el("div", "pane-title", "Each generated token (rows, step 1 at the top) from the tokens before it " +
      "(columns; grey: not there yet), each row on its own range; the current step is outlined, click a row to go to it."));
    cv.width = C * px; cv.height = N * px;
    var ctx = cv.getContext("2d"), img = ctx.createImageData(C, N);
    for (var t = 0; t < N; t++) {
      var row = steps.subarray(t * C, (t + 1) * C), r = range({ scores: row.subarray(0, L + t), pos: L + t - 1 });
      for (var j = 0; j < C; j++) {
        var v = row[j], at = t * C + j;
        if (v !== v) { img.data[4 * at] = NAN[0]; img.data[4 * at + 1] = NAN[1]; img.data[4 * at + 2] = NAN[2]; img.data[4 * at + 3] = 255; }
        else AK.paintSigned(img.data, at, AK.toSigned(v, r.m, state.scale));
      }
    }
    var small = el("canvas"); small.width = C; small.height = N; small.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false; ctx.drawImage(small, 0, 0, C * px, N * px);
    ctx.strokeStyle = AK.dark ? "#ff8a4c" : "#c2410c"; ctx.lineWidth = Math.max(1, Math.min(2, px / 2));
    ctx.strokeRect(0, cur.step * px, C * px, px);
    cv.style.width = Math.min(C * px, MAT * 2) + "px"; cv.style.height = (Math.min(C * px, MAT * 2) * N / C) + "px";
    function cell(ev) {
      var b = cv.getBoundingClientRect();
      return [Math.floor((ev.clientY - b.top) / b.height * N), Math.floor((ev.clientX - b.left) / b.width * C)];
    }
    cv.addEventListener("pointermove", function (ev) {
      var c = cell(ev), t = c[0], j = c[1];
      if (t < 0 || t >= N || j < 0 || j >= C) return;
      var v = steps[t * C + j];
      AK.tip(ev, "step " + (t + 1) + ": #" + (L + t) + " " + AK.plain(E.tokens[L + t]) + " \u2190 #" + j + " " +
        AK.plain(E.tokens[j]) + "   " + (v === v ? sign(v) : "not there yet"));
    });
    cv.addEventListener("pointerleave", AK.hideTip);
    cv.addEventListener("click", function (ev) {
      var t = cell(ev)[0];
      if (t < 0 || t >= N) return;
      state.step = t + 1;
      AK.render();
    });
    box.appendChild(cv);
  }

  // The picture the model saw with each patch coloured by its score (as the tokens are); the
  // non-patch tokens ([CLS], ...) stay in the token line above.
  function drawPicture(box, cur) {
    if (!I || !picture || !picture.complete || !picture.naturalWidth) return;
    var P = I.prefix.length, R = I.rows, C = I.cols, W = picture.naturalWidth, H = picture.naturalHeight;
    var k = 448 / Math.max(W, H), cv = el("canvas", "explain-picture"), r = range(cur);
    cv.width = Math.round(W * k); cv.height = Math.round(H * k);
    var ctx = cv.getContext("2d");
    ctx.drawImage(picture, 0, 0, cv.width, cv.height);
    var ph = I.patch[0] * k, pw = I.patch[1] * k;
    for (var i = 0; i < R * C && P + i < cur.scores.length; i++) {
      var t = AK.toSigned(cur.scores[P + i], r.m, state.scale);
      ctx.fillStyle = signedColour(cur.scores[P + i], r.m).replace("rgb(", "rgba(").replace(")", ", " + (0.1 + 0.7 * Math.abs(t)).toFixed(3) + ")");
      ctx.fillRect((i % C) * pw, Math.floor(i / C) * ph, pw, ph);
    }
    cv.addEventListener("pointermove", function (ev) {
      var b = cv.getBoundingClientRect(), c = Math.floor((ev.clientX - b.left) / b.width * cv.width / pw);
      var rr = Math.floor((ev.clientY - b.top) / b.height * cv.height / ph), at = P + rr * C + c;
      if (c >= 0 && c < C && rr >= 0 && rr < R && at < cur.scores.length) AK.tip(ev, cur.tokens[at] + "   " + sign(cur.scores[at]));
    });
    cv.addEventListener("pointerleave", AK.hideTip);
    box.appendChild(el("div", "pane-title", "The picture the model saw, each patch coloured by its relevance (as the tokens above)"));
    box.appendChild(cv);
  }

  view.draw = function () {
    var box = $("explain-body"), cur = current();
    clear(box);
    box.appendChild(el("p", "explain-what", "Explaining the " + cur.target + " = " + AK.fmt(cur.value) + " by " +
      E.method.replace(/_/g, " ") + (E.baselineValue === null ? "" : " (at zero embeddings: " + AK.fmt(E.baselineValue) + ")") +
      (E.generation ? " (generated token " + (cur.step + 1) + " of " + E.matrix.shape[0] + "; the slider above moves it)" : "") + "."));
    drawTokens(box, cur);
    drawPicture(box, cur);
    drawHeads(box, cur);
    if (E.generation) drawSteps(box, cur); else drawMatrix(box);
  };
  // The view as SVG parts: the token line as text on its colours, then the grid and matrix canvases.
  view.svg = function (image, text) {
    var y = 60, x = 10, W = 600, cur = current(), m = range(cur).m, scores = cur.scores;
    text(10, 40, $("explain-body").firstChild.textContent, 'font-size="12"');
    cur.tokens.forEach(function (t, i) {
      var w = 8 * AK.plain(t).length + 8;
      if (x + w > 1000) { x = 10; y += 24; }
      image(tokenCanvas(signedColour(scores[i], m)), x, y - 15, w, 20);
      text(x + 4, y, AK.plain(t), 'font-family="monospace" font-size="13"');
      x += w + 2; W = Math.max(W, x);
    });
    var cv = $("explain-body").querySelector("canvas");
    if (cv) { image(cv, 10, y + 20, parseFloat(cv.style.width), parseFloat(cv.style.height)); y += 30 + parseFloat(cv.style.height); }
    return [W + 10, y + 20];
  };
  function tokenCanvas(colour) {
    var c = el("canvas"); c.width = 1; c.height = 1;
    var ctx = c.getContext("2d"); ctx.fillStyle = colour; ctx.fillRect(0, 0, 1, 1);
    return c;
  }
})(AK);
