"use strict";
// attnkit's attention viewer, part 7: what leaves the page. The current view as SVG or PNG; the
// current head's matrix and the statistics table as CSV (token labels, a few "# " lines first
// that say what the file holds; text fields are quoted, so pandas.read_csv(path, comment="#")
// reads them).
(function (AK) {
  var $ = AK.$, el = AK.el, state = AK.state;

  function download(name, blob) {
    var a = el("a"); a.href = URL.createObjectURL(blob); a.download = name;
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(function () { URL.revokeObjectURL(a.href); }, 1000);
  }

  // ---- the view as one SVG (vector lines and text, the canvases as images); PNG from it
  var SVG_NS = ["http", "//www.w3.org/2000/svg"].join(":");  // a name, never fetched
  function svgOf() {
    var W = 0, H = 0, parts = [], title = AK.D.title + " \u2014 " + AK.describeView();
    // XML's escapes, and U+FFFD for the control characters XML 1.0 cannot hold (a token's ESC
    // or form feed made the file unreadable and the PNG made from it empty)
    function esc(s) {
      return String(s).replace(/[\u0000-\u0008\u000B\u000C\u000E-\u001F]/g, "\uFFFD")
        .replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; });
    }
    function image(cv, x, y, w, h) {
      parts.push('<image x="' + x + '" y="' + y + '" width="' + w + '" height="' + h + '" preserveAspectRatio="none" ' +
        'style="image-rendering:pixelated" href="' + cv.toDataURL("image/png") + '"/>');
    }
    function text(x, y, s, attrs) {
      parts.push('<text x="' + x + '" y="' + y + '" ' + (attrs || "") + ' fill="' + fg + '">' + esc(s) + "</text>");
    }
    var fg = getComputedStyle(document.body).color, bg = getComputedStyle(document.body).backgroundColor;
    if (state.view === "head") {
      var x0 = 0, ROW = AK.views.head.ROW, lw = 160;
      AK.views.head.panels().forEach(function (p) {
        var q = p.q.children, k = p.k.children, lines = p.canvas;
        if (p.name && !p.name.hidden) text(x0 + 10, 34, p.name.textContent, 'font-size="12"');
        H = Math.max(H, Math.max(q.length, k.length) * ROW + 60);
        image(lines, x0 + lw, 44, lines.clientWidth, lines.clientHeight);
        [[q, x0 + lw - 6, "end"], [k, x0 + lw + lines.clientWidth + 6, "start"]].forEach(function (c) {
          for (var i = 0; i < c[0].length; i++) {
            var bgc = c[0][i].style.background;
            if (bgc) parts.push('<rect x="' + (c[2] === "end" ? c[1] - 150 : c[1] - 4) + '" y="' + (44 + i * ROW + 2) + '" width="154" height="' + (ROW - 4) + '" fill="' + bgc + '"/>');
            text(c[1], 44 + i * ROW + ROW / 2 + 4, c[0][i].textContent, 'text-anchor="' + c[2] + '" font-family="monospace" font-size="13"');
          }
        });
        x0 += 2 * lw + lines.clientWidth + 20;
      });
      W = x0;
    } else if (state.view === "model" || state.view === "stats" || state.view === "neuron") {
      var y0 = 40;
      if (state.view === "stats") { W = 400; H = 60; text(10, 45, "Save the table with \u2018statistics CSV\u2019."); }
      (state.view === "stats" ? [] : AK.views[state.view].panels()).forEach(function (p) {
        if (p.root.hidden) return;
        var cvs = Array.prototype.slice.call(p.root.querySelectorAll(state.view === "model" ? ".thumbs canvas" : ".neuron canvas"));
        var name = p.root.querySelector(".side-name"), nH = state.view === "model" ? +cvs[cvs.length - 1].dataset.head + 1 : 1, side = 64;
        if (name && !name.hidden) { text(10, y0 + 10, name.textContent, 'font-size="12"'); y0 += 20; }
        var bottom = y0;
        cvs.forEach(function (cv, i) {
          var x = state.view === "model" ? 70 + (i % nH) * (side + 6) : 10;
          var y = y0 + (state.view === "model" ? Math.floor(i / nH) * (side + 6) : i * 70);
          var w = state.view === "model" ? side : cv.width, h = state.view === "model" ? side : cv.height;
          image(cv, x, y, w, h); W = Math.max(W, x + w + 10); bottom = Math.max(bottom, y + h + 10);
          if (state.view === "model" && i % nH === 0) text(64, y + side / 2, "layer " + cv.dataset.layer, 'text-anchor="end" font-size="11"');
        });
        y0 = bottom + 10; H = Math.max(H, y0);
      });
    } else if (AK.views[state.view] && AK.views[state.view].svg) {  // a view that lays out its own parts
      var size = AK.views[state.view].svg(image, text);
      W = size[0]; H = size[1];
    } else {
      var xm = 0, lab = 120;
      AK.views.matrix.panels().forEach(function (p) {
        var cur = p.cur;
        if (!cur) return;
        var m = p.canvas, w2 = parseFloat(m.style.width), h2 = parseFloat(m.style.height);
        if (!p["side-name"].hidden) text(xm + lab, 34, p["side-name"].textContent, 'font-size="12"');
        image(m, xm + lab, 44, w2, h2);
        var step = Math.max(1, Math.ceil(12 / cur.cell)), labels = cur.blocks ? null : cur.labels;
        if (labels) {
          for (var i2 = 0; i2 < cur.rows; i2 += step) text(xm + lab - 4, 44 + (i2 + 0.5) * cur.cell + 4, AK.plain(labels[0][cur.win[0] + i2]), 'text-anchor="end" font-family="monospace" font-size="10"');
          for (var j2 = 0; j2 < cur.cols; j2 += step) {
            var x2 = xm + lab + (j2 + 0.5) * cur.cell;
            parts.push('<text transform="translate(' + (x2 + 4) + "," + (48 + h2) + ') rotate(90)" font-family="monospace" font-size="10" fill="' + fg + '">' + esc(AK.plain(labels[1][cur.win[2] + j2])) + "</text>");
          }
        }
        W = xm + lab + w2 + 20; H = Math.max(H, lab + h2 + 54);
        xm = W;
      });
    }
    W = Math.max(W, 420);
    return '<svg xmlns="' + SVG_NS + '" width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + " " + H + '">' +
      '<rect width="100%" height="100%" fill="' + bg + '"/><text x="8" y="18" font-size="13" fill="' + fg + '">' + esc(title) + "</text>" + parts.join("") + "</svg>";
  }
  function savePNG() {
    var svg = svgOf(), img = new Image();
    img.onload = function () {
      var cv = el("canvas"), m = /width="(\d+(?:\.\d+)?)" height="(\d+(?:\.\d+)?)"/.exec(svg);
      cv.width = Math.ceil(+m[1]) * 2; cv.height = Math.ceil(+m[2]) * 2;
      var ctx = cv.getContext("2d"); ctx.scale(2, 2); ctx.imageSmoothingEnabled = false; ctx.drawImage(img, 0, 0);
      cv.toBlob(function (b) { download("attention-" + state.view + ".png", b); document.body.dataset.saved = "png"; }, "image/png");
    };
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg);
  }
  $("save-svg").addEventListener("click", function () {
    download("attention-" + state.view + ".svg", new Blob([svgOf()], { type: "image/svg+xml" }));
    document.body.dataset.saved = "svg";
  });
  $("save-png").addEventListener("click", savePNG);

  // ---- CSV
  // A text field, quoted; one that starts as a formula would (=, +, -, @, tab, return) gets a
  // leading ' so that a spreadsheet shows it instead of running it.
  function quote(s) {
    s = String(s);
    if (/^[=+\-@\t\r]/.test(s)) s = "'" + s;
    return '"' + s.replace(/"/g, '""') + '"';
  }
  function num(v) { return v === 0 ? "0" : String(+v.toPrecision(5)); }
  function label(tokens, i) { return quote(i + ":" + tokens[i]); }
  function notes(lines) {
    return lines.map(function (l) { return "# " + l.replace(/[\r\n]+/g, " "); }).join("\n") + "\n";
  }
  var STORED = "Weights as the page holds them: one byte each, within 1/510 of each head's largest weight.";

  // What the matrix CSV holds: the grid of the current view (attention or rollout) and heads.
  function matrixSource(side) {
    var S = side.S, roll = state.view === "rollout";
    var g = roll ? (state.flow === "flow" && S.flow ? S.flow : S.rollout) : S;
    var heads = roll ? [0] : AK.heads(S), l = roll ? 0 : state.layer;
    var what = roll ? (g === S.flow ? "attention flow" : "attention rollout") : S.name + ", " + S.layers[l] + ", " +
      (heads.length === 1 ? S.heads[heads[0]] : "mean of " + heads.map(function (h) { return S.heads[h]; }).join(", "));
    return { S: S, g: g, l: l, heads: heads, what: what, roll: roll };
  }
  // Dense: one row per query, one column per key (the mean over the chosen heads).
  function denseWide(src) {
    var S = src.S, g = src.g, out = [quote("query \\ key") + "," + S.keyTokens.map(function (t, j) { return label(S.keyTokens, j); }).join(",")];
    for (var i = 0; i < g.Q; i++) {
      var w = AK.combine(g, src.l, src.heads, [i], "mean").w, line = [label(S.tokens, i)];
      for (var j = 0; j < g.K; j++) line.push(num(w[j]));
      out.push(line.join(","));
    }
    return out.join("\n") + "\n";
  }
  // Long: what the page holds of every weight, each query's top k keys per head.
  function longRows(src, prefix) {
    var S = src.S, g = src.g, k = g.k, out = [];
    src.heads.forEach(function (h) {
      var s = g.tkScale[src.l * g.nH + h] / 255;
      for (var i = 0; i < g.Q; i++) {
        var at = ((src.l * g.nH + h) * g.Q + i) * k, entries = [];
        for (var c = 0; c < k; c++) entries.push([g.tkW[at + c] * s, g.tkIdx[at + c]]);
        entries.sort(function (a, b) { return b[0] - a[0]; });
        entries.forEach(function (e, r) {
          out.push(prefix + [quote(src.roll ? "rollout" : S.heads[h]), i, quote(S.tokens[i]), e[1], quote(S.keyTokens[e[1]]), num(e[0]), r + 1].join(","));
        });
      }
    });
    return out;
  }
  function denseRows(src, prefix) {
    var S = src.S, g = src.g, out = [];
    for (var i = 0; i < g.Q; i++) {
      var w = AK.combine(g, src.l, src.heads, [i], "mean").w;
      for (var j = 0; j < g.K; j++) out.push(prefix + [i, quote(S.tokens[i]), j, quote(S.keyTokens[j]), num(w[j])].join(","));
    }
    return out;
  }
  function matrixCSV() {
    var sides = AK.sides(), srcs = sides.map(matrixSource), first = srcs[0], long = first.g.mode === "long";
    var head = ["attnkit attention matrix: " + AK.D.title, "Rows are queries, columns keys; labels are position:token.",
                "A text field that starts with =, +, -, @, a tab or a return has a ' before it (a spreadsheet would run it as a formula)."];
    var stored = long ? ["Long input: the page holds, for every head, each query's top " + first.g.k + " keys " +
      "(exact up to one byte per weight) and block overviews; this file holds those top " + first.g.k +
      " keys of every query, per head. Every other weight is below its row's " + AK.ordinal(first.g.k) +
      " and is not stored on the page."] : [STORED];
    if (sides.length === 1) {
      head.push("What: " + first.what + ".");
      var body = long ? "head,query,query_token,key,key_token,weight,rank\n" + longRows(first, "").join("\n") + "\n" : denseWide(first);
      return { name: "attention-" + (first.roll ? first.g === first.S.flow ? "flow" : "rollout" : "layer" + state.layer + "-" +
        (first.heads.length === 1 ? "head" + first.heads[0] : "heads-mean")) + ".csv", text: notes(head.concat(stored)) + body };
    }
    // A comparison, both sides: one tidy table; A, B and A - B side by side where the tokens are equal.
    var diff = AK.diff(), dense = !long && srcs.every(function (s) { return s.g.mode === "dense"; });
    head.push("Comparison: " + sides.map(function (s, i) { return s.name + " = " + s.label + " (" + srcs[i].what + ")"; }).join("; ") + ".");
    var rows;
    if (dense && diff && !first.roll) {
      head.push("A_minus_B: the difference made from the exact weights (one signed byte within 1/254 of the head's largest |A - B|).");
      rows = ["query,query_token,key,key_token,A,B,A_minus_B"];
      var S = first.S, b = srcs[1];
      for (var i = 0; i < S.shape[2]; i++) {
        var wa = AK.combine(first.g, first.l, first.heads, [i], "mean").w, wb = AK.combine(b.g, b.l, b.heads, [i], "mean").w;
        var wd = AK.diffRow(diff, first.l, first.heads, i);
        for (var j = 0; j < S.shape[3]; j++) rows.push([i, quote(S.tokens[i]), j, quote(S.keyTokens[j]), num(wa[j]), num(wb[j]), num(wd[j])].join(","));
      }
    } else if (dense) {
      rows = ["side,query,query_token,key,key_token,weight"];
      srcs.forEach(function (s, n) { rows = rows.concat(denseRows(s, sides[n].name + ",")); });
    } else {
      rows = ["side,head,query,query_token,key,key_token,weight,rank"];
      srcs.forEach(function (s, n) { rows = rows.concat(s.g.mode === "long" ? longRows(s, sides[n].name + ",") : []); });
    }
    return { name: "attention-compare-layer" + state.layer + ".csv", text: notes(head.concat(stored)) + rows.join("\n") + "\n" };
  }
  function statsCSV() {
    var sides = AK.sides(), cols = AK.views.stats.cols(sides), rows = AK.views.stats.rows(sides), S = sides[0].S;
    var head = ["attnkit head statistics: " + AK.D.title + " (" + S.name + ")",
                "Exact: computed from every weight, on long inputs too. Entropy in nats; normalized entropy divides by log(keys).",
                "pattern: previous token, first token (sink), self, local window (+-4), broad or mixed; score: that pattern's share."];
    if (AK.compare) head.push("Sides: " + sides.map(function (s) { return s.name + " = " + s.label; }).join("; ") + ".");
    var out = [cols.map(function (c) { return c[0] === "class" ? "pattern" : c[0]; }).join(",")];
    rows.forEach(function (r) {
      out.push(cols.map(function (c) {
        var v = c[0] === "layer" ? r.S.layers[r.layer] : c[0] === "head" ? r.S.heads[r.head] : r[c[0]];
        return typeof v === "number" ? num(v) : quote(v);
      }).join(","));
    });
    return { name: "attention-statistics.csv", text: notes(head) + out.join("\n") + "\n" };
  }
  function saveCSV(make, tag) {
    var f = make();
    download(f.name, new Blob([f.text], { type: "text/csv;charset=utf-8" }));
    document.body.dataset.saved = tag;
  }
  $("csv-matrix").addEventListener("click", function () { saveCSV(matrixCSV, "csv-matrix"); });
  $("csv-stats").addEventListener("click", function () { saveCSV(statsCSV, "csv-stats"); });
  AK.svgOf = svgOf; AK.matrixCSV = matrixCSV; AK.statsCSV = statsCSV;
})(AK);
