// The ranks page: every rank's memory by iteration, overlaid and as small multiples, from the
// JSON island `hw-ranks`. Profile strings only ever reach the page as text.
(function () {
  "use strict";
  var started = performance.now();
  var island = document.getElementById("hw-ranks");
  if (!island) return;
  var data = JSON.parse(island.textContent);
  var SVG = "http://www.w3.org/2000/svg";
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  // The same units as the rest of highwater (units::format_bytes).
  function fmtBytes(b) {
    if (b < 1024) return Math.round(b) + " B";
    var u = 0, v = b;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    if (Math.round(v * 10) >= 10240 && u < UNITS.length - 1) { v /= 1024; u++; }
    return v.toFixed(1) + " " + UNITS[u];
  }
  window.highwaterRanksFormat = { bytes: fmtBytes };

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }

  var curves = data.ranks;
  var byRank = {};
  curves.forEach(function (c) { byRank[c.rank] = c; });
  var xMin = Infinity, xMax = -Infinity, yPeak = 0;
  curves.forEach(function (c) {
    if (c.x.length) { xMin = Math.min(xMin, c.x[0]); xMax = Math.max(xMax, c.x[c.x.length - 1]); }
    yPeak = Math.max(yPeak, c.peak);
  });
  if (!isFinite(xMin)) { xMin = 0; xMax = 1; }
  if (xMax <= xMin) xMax = xMin + 1;
  // A capacity far above every peak would flatten the curves: drawn only when it is near.
  var showCapacity = data.capacity !== null && data.capacity <= 2 * yPeak;
  var yMax = Math.max(yPeak, showCapacity ? data.capacity : 0) * 1.05 || 1;

  // One step of a round size in binary units, about `want` of them over `max`.
  function byteStep(max, want) {
    var raw = max / want, unit = 1;
    while (raw >= 1024 * unit) unit *= 1024;
    var v = raw / unit, nice = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 512, 1024];
    for (var i = 0; i < nice.length; i++) if (nice[i] >= v) return nice[i] * unit;
    return 1024 * unit;
  }
  function iterStep(span) {
    var raw = span / 8, pow = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-9))));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * pow >= raw) return Math.max(steps[i] * pow, data.by_iteration ? 1 : 0);
    return 10 * pow;
  }

  // The value a step curve holds at x: the last point at or before it.
  function valueAt(c, x) {
    var lo = 0, hi = c.x.length - 1;
    if (hi < 0 || x < c.x[0]) return null;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (c.x[mid] <= x) lo = mid; else hi = mid - 1;
    }
    return c.y[lo];
  }

  function stepPath(c, sx, sy) {
    if (!c.x.length) return "";
    var d = "M" + sx(c.x[0]).toFixed(1) + "," + sy(c.y[0]).toFixed(1);
    for (var i = 1; i < c.x.length; i++) {
      d += "H" + sx(c.x[i]).toFixed(1) + "V" + sy(c.y[i]).toFixed(1);
    }
    return d;
  }

  // Past this many iterations in view, each rank is drawn as the most (and least) bytes it held
  // in each iteration: the steps inside iterations would only blur into a band.
  var DETAIL_ITERATIONS = 40;
  var envelopes = {};
  function envelope(c) {
    if (envelopes[c.rank]) return envelopes[c.rank];
    var x = [], hi = [], lo = [], at = null;
    for (var i = 0; i < c.x.length; i++) {
      var k = Math.floor(c.x[i]);
      if (k !== at) { x.push(k); hi.push(c.y[i]); lo.push(c.y[i]); at = k; continue; }
      var n = x.length - 1;
      if (c.y[i] > hi[n]) hi[n] = c.y[i];
      if (c.y[i] < lo[n]) lo[n] = c.y[i];
    }
    if (x.length) { x.push(x[x.length - 1] + 1); hi.push(hi[hi.length - 1]); lo.push(lo[lo.length - 1]); }
    envelopes[c.rank] = { rank: c.rank, peak: c.peak, partial: c.partial, x: x, y: hi, lo: lo };
    return envelopes[c.rank];
  }
  function coarse(span) { return data.by_iteration && span > DETAIL_ITERATIONS; }
  // The band between a rank's least and most bytes per iteration.
  function bandPath(e, sx, sy) {
    var n = e.x.length;
    if (n < 2) return "";
    var d = "M" + sx(e.x[0]).toFixed(1) + "," + sy(e.y[0]).toFixed(1);
    for (var i = 1; i < n; i++) d += "H" + sx(e.x[i]).toFixed(1) + "V" + sy(e.y[i]).toFixed(1);
    d += "V" + sy(e.lo[n - 1]).toFixed(1);
    for (var j = n - 1; j > 0; j--) d += "H" + sx(e.x[j]).toFixed(1) + "V" + sy(e.lo[j - 1]).toFixed(1);
    return d + "H" + sx(e.x[0]).toFixed(1) + "Z";
  }

  var tip = document.getElementById("tip");
  function showTip(ev, html) {
    tip.innerHTML = "";
    html.forEach(function (part) {
      var line = document.createElement("div");
      if (part.bold) { var b = document.createElement("b"); b.textContent = part.bold; line.appendChild(b); }
      if (part.text) line.appendChild(document.createTextNode(part.text));
      tip.appendChild(line);
    });
    tip.hidden = false;
    var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = x + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  }
  function hideTip() { tip.hidden = true; }

  var paths = {};
  var picked = null;
  // The x range the overlay shows (dragging across it zooms in); null: everything.
  var zoom = null;

  function xText(x) {
    return data.by_iteration ? "iteration " + (x < 0 ? "(setup)" : x.toFixed(2))
      : (100 * x).toFixed(1) + " % of the run";
  }

  function drawOverlay() {
    var box = document.getElementById("overlay-chart");
    box.innerHTML = "";
    paths = {};
    var x0 = zoom ? zoom[0] : xMin, x1 = zoom ? zoom[1] : xMax;
    var shown = coarse(x1 - x0) ? curves.map(envelope) : curves;
    document.getElementById("overlay-mode").textContent = coarse(x1 - x0)
      ? "Drawn: each rank's most bytes in each iteration; drag across a few iterations to see the steps inside them."
      : "Drawn: every step of each rank's live bytes.";
    var reset = document.getElementById("zoom-reset");
    reset.disabled = !zoom;
    document.getElementById("zoom-range").textContent = zoom ? "showing " + xText(x0) + " to " + xText(x1) : "";
    var W = Math.max(box.clientWidth || 900, 320), H = 340;
    var L = 72, R = 16, T = 12, B = 36;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img",
      "aria-label": "memory of every rank by iteration" }, box);
    var clip = "clip-overlay";
    el("rect", { x: L, y: 0, width: W - L - R, height: H - B }, el("clipPath", { id: clip }, el("defs", {}, svg)));
    var sx = function (x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    var sy = function (y) { return T + (1 - y / yMax) * (H - T - B); };
    var ys = byteStep(yMax, 5);
    for (var y = 0; y <= yMax; y += ys) {
      el("line", { class: "grid", x1: L, x2: W - R, y1: sy(y), y2: sy(y) }, svg);
      el("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }, svg).textContent = fmtBytes(y);
    }
    var xs = iterStep(x1 - x0);
    for (var x = Math.ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs) {
      el("line", { class: "grid", x1: sx(x), x2: sx(x), y1: T, y2: H - B }, svg);
      el("text", { x: sx(x), y: H - B + 14, "text-anchor": "middle" }, svg).textContent =
        data.by_iteration ? String(Math.round(x * 100) / 100) : (100 * x).toFixed(0) + "%";
    }
    el("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, svg).textContent = data.x_label;
    el("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }, svg);
    el("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }, svg);
    if (showCapacity) {
      el("line", { class: "capline", x1: L, x2: W - R, y1: sy(data.capacity), y2: sy(data.capacity) }, svg);
      el("text", { x: W - R, y: sy(data.capacity) - 4, "text-anchor": "end" }, svg).textContent =
        data.device + " capacity " + fmtBytes(data.capacity);
    }
    var group = el("g", { "clip-path": "url(#" + clip + ")" }, svg);
    var heavy = null;
    shown.forEach(function (c) {
      var cls = "rank" + (c.rank === data.heaviest ? " heavy" : "") + (c.partial ? " partial" : "");
      var p = el("path", { class: cls, d: stepPath(c, sx, sy), "data-rank": c.rank }, group);
      paths[c.rank] = p;
      if (c.rank === data.heaviest) heavy = p;
    });
    if (heavy) group.appendChild(heavy);
    var hc = null;
    shown.forEach(function (c) { if (c.rank === data.heaviest) hc = c; });
    if (hc && hc.x.length) {
      var k = -1;
      for (var i = 0; i < hc.y.length; i++) {
        if (hc.x[i] >= x0 && hc.x[i] <= x1 && (k < 0 || hc.y[i] > hc.y[k])) k = i;
      }
    }
    if (hc && k >= 0) {
      el("circle", { cx: sx(hc.x[k]), cy: sy(hc.y[k]), r: 4, fill: "var(--peak)" }, svg);
      el("text", { class: "peaklabel", x: sx(hc.x[k]) + 6, y: Math.max(sy(hc.y[k]) - 6, T + 10) }, svg)
        .textContent = "rank " + data.heaviest + " (heaviest): " + fmtBytes(hc.peak);
    }
    if (picked !== null && paths[picked]) { paths[picked].classList.add("picked"); group.appendChild(paths[picked]); }
    var hovered = null, dragFrom = null, brush = null;
    function unhover() { if (hovered !== null && paths[hovered]) paths[hovered].classList.remove("hover"); hovered = null; }
    function at(ev) {
      var rect = svg.getBoundingClientRect();
      var px = (ev.clientX - rect.left) * W / rect.width, py = (ev.clientY - rect.top) * H / rect.height;
      return { px: Math.min(Math.max(px, L), W - R), py: py, x: x0 + (Math.min(Math.max(px, L), W - R) - L) / (W - L - R) * (x1 - x0) };
    }
    svg.addEventListener("mousedown", function (ev) {
      dragFrom = at(ev);
      brush = el("rect", { class: "brush", x: dragFrom.px, y: T, width: 0, height: H - T - B }, svg);
      ev.preventDefault();
    });
    svg.addEventListener("mouseup", function (ev) {
      if (!dragFrom) return;
      var to = at(ev), from = dragFrom;
      dragFrom = null;
      if (brush) { brush.remove(); brush = null; }
      if (Math.abs(to.px - from.px) > 4) {
        zoom = [Math.min(from.x, to.x), Math.max(from.x, to.x)];
        hideTip();
        drawOverlay();
      } else if (hovered !== null) {
        pick(hovered);
      }
    });
    svg.addEventListener("mousemove", function (ev) {
      var p = at(ev), x = p.x, py = p.py;
      if (dragFrom && brush) {
        brush.setAttribute("x", Math.min(dragFrom.px, p.px));
        brush.setAttribute("width", Math.abs(p.px - dragFrom.px));
        return;
      }
      var best = null, bestDist = 14;
      shown.forEach(function (c) {
        var v = valueAt(c, x);
        if (v === null) return;
        var dist = Math.abs(sy(v) - py);
        if (dist < bestDist) { bestDist = dist; best = { c: c, v: v }; }
      });
      unhover();
      if (!best) { hideTip(); return; }
      hovered = best.c.rank;
      paths[hovered].classList.add("hover");
      group.appendChild(paths[hovered]);
      showTip(ev, [
        { bold: "rank " + best.c.rank + (best.c.rank === data.heaviest ? " (heaviest)" : "") },
        { text: fmtBytes(best.v) + (shown === curves ? " at " : " at most in ") + xText(shown === curves ? x : Math.floor(x)) },
        { text: "peak " + fmtBytes(best.c.peak) }
      ]);
    });
    svg.addEventListener("mouseleave", function () {
      unhover(); hideTip();
      if (brush) { brush.remove(); brush = null; }
      dragFrom = null;
    });
  }
  document.getElementById("zoom-reset").addEventListener("click", function () { zoom = null; drawOverlay(); });

  function drawMultiples() {
    var grid = document.getElementById("multiples-grid");
    var note = document.getElementById("multiples-note");
    grid.innerHTML = "";
    var shown = data.small.filter(function (r) { return byRank[r]; });
    var bands = coarse(xMax - xMin);
    note.textContent = (shown.length < curves.length
      ? shown.length + " of " + curves.length + " ranks, those that peak highest, in rank order; every rank is in the chart above and the table below. "
      : "") + "One scale for all: the same height is the same bytes" + (bands
      ? "; the line is each iteration's most bytes, the band down to its least"
      : "") + ". Click one to pick its curve out.";
    var W = 220, H = 70;
    var sx = function (x) { return (x - xMin) / (xMax - xMin) * W; };
    var sy = function (y) { return 2 + (1 - y / yMax) * (H - 4); };
    shown.forEach(function (rank) {
      var c = byRank[rank];
      var card = document.createElement("div");
      card.className = "mini" + (rank === data.heaviest ? " heavy" : "") + (rank === picked ? " picked" : "");
      card.setAttribute("data-rank", rank);
      var title = document.createElement("div");
      title.className = "title";
      var name = document.createElement("span");
      name.textContent = "rank " + rank + (rank === data.heaviest ? " · heaviest" : "") + (c.partial ? " · partial" : "");
      var peak = document.createElement("b");
      peak.textContent = fmtBytes(c.peak);
      title.appendChild(name);
      title.appendChild(peak);
      card.appendChild(title);
      var svg = el("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none" }, card);
      if (bands) {
        var e = envelope(c);
        el("path", { class: "area", d: bandPath(e, sx, sy) }, svg);
        el("path", { class: "mline", d: stepPath(e, sx, sy) }, svg);
      } else {
        var line = stepPath(c, sx, sy);
        if (line) {
          el("path", { class: "area", d: line + "V" + sy(0) + "H" + sx(c.x[0]).toFixed(1) + "Z" }, svg);
          el("path", { class: "mline", d: line }, svg);
        }
      }
      if (showCapacity) el("line", { class: "capline", x1: 0, x2: W, y1: sy(data.capacity), y2: sy(data.capacity) }, svg);
      card.addEventListener("click", function () { pick(rank); });
      grid.appendChild(card);
    });
  }

  // Picks a rank out everywhere (or lets it go when picked again).
  function pick(rank) {
    picked = picked === rank ? null : rank;
    Object.keys(paths).forEach(function (r) {
      var on = +r === picked;
      paths[r].classList.toggle("picked", on);
      if (on) paths[r].parentNode.appendChild(paths[r]);
    });
    Array.prototype.forEach.call(document.querySelectorAll("[data-rank]"), function (node) {
      if (node.tagName === "path") return;
      node.classList.toggle("picked", +node.getAttribute("data-rank") === picked);
    });
  }

  var table = document.getElementById("rank-table");
  if (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener("click", function () {
        var desc = th.getAttribute("aria-sort") !== "descending";
        Array.prototype.forEach.call(heads, function (o) { o.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", desc ? "descending" : "ascending");
        var num = th.getAttribute("data-type") === "num";
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col], y = b.cells[col], r;
          // Rows of missing ranks have one cell past the rank: they sort last.
          if (!x || x.colSpan > 1) return 1;
          if (!y || y.colSpan > 1) return -1;
          if (num) r = parseFloat(x.getAttribute("data-v")) - parseFloat(y.getAttribute("data-v"));
          else r = x.textContent.localeCompare(y.textContent);
          return desc ? -r : r;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
    table.tBodies[0].addEventListener("click", function (ev) {
      var row = ev.target.closest("tr[data-rank]");
      if (row && byRank[+row.getAttribute("data-rank")]) pick(+row.getAttribute("data-rank"));
    });
  }

  function draw() { drawOverlay(); drawMultiples(); }
  draw();
  var pending = null;
  window.addEventListener("resize", function () {
    if (pending) clearTimeout(pending);
    pending = setTimeout(draw, 100);
  });
  document.getElementById("overlay-chart").setAttribute("data-draw-ms", (performance.now() - started).toFixed(1));
})();
