// highwater report: draws the charts from the data island, sorts tables, folds the span tree.
// Profile strings are user data: they only ever reach the page through textContent.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("hw-data").textContent);
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  function fmtBytes(b) {
    if (b < 1024) return Math.round(b) + " B";
    var u = 0, v = b;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    if (Math.round(v * 10) >= 10240 && u < UNITS.length - 1) { v /= 1024; u++; }
    return v.toFixed(1) + " " + UNITS[u];
  }
  function fmtTime(ns) {
    if (ns < 1e3) return Math.round(ns) + " ns";
    if (ns < 999950) return (ns / 1e3).toFixed(1) + " µs";
    if (ns < 999950000) return (ns / 1e6).toFixed(1) + " ms";
    return (ns / 1e9).toFixed(2) + " s";
  }
  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x, y, s, cls, anchor) {
    var t = el("text", { x: x, y: y, "text-anchor": anchor || "start" }, parent);
    if (cls) t.setAttribute("class", cls);
    t.textContent = s;
    return t;
  }
  // A "nice" axis step in binary units (1, 2, 5 × 1024^k bytes) for about `count` ticks.
  function byteStep(max, count) {
    var unit = 1;
    while (max / unit >= 1024 * count && unit < Math.pow(1024, 6)) unit *= 1024;
    var steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1024];
    for (var i = 0; i < steps.length; i++) if (max / (steps[i] * unit) <= count) return steps[i] * unit;
    return 1024 * unit;
  }
  function timeStep(max, count) {
    var raw = max / count, p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var m = [1, 2, 5, 10];
    for (var i = 0; i < m.length; i++) if (m[i] * p >= raw) return m[i] * p;
    return 10 * p;
  }

  var W = 1000, H = 250, L = 70, R = 16, T = 18, B = 26;
  var tip = document.getElementById("tip");

  // Frame with axes and grid; returns scale functions.
  function frame(svg, tmax, ymax, yfmt) {
    var sx = function (t) { return L + (tmax > 0 ? (t / tmax) * (W - L - R) : 0); };
    var sy = function (v) { return H - B - (ymax > 0 ? (v / ymax) * (H - T - B) : 0); };
    var ys = yfmt === "pct" ? 0.25 : byteStep(ymax, 5);
    for (var v = 0; v <= ymax + 1e-9; v += ys) {
      el("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), "class": "grid" }, svg);
      text(svg, L - 6, sy(v) + 4, yfmt === "pct" ? Math.round(v * 100) + "%" : fmtBytes(v), null, "end");
    }
    var ts = timeStep(tmax, 8);
    for (var t = 0; t <= tmax; t += ts) {
      el("line", { x1: sx(t), x2: sx(t), y1: H - B, y2: H - B + 4, "class": "axis" }, svg);
      text(svg, sx(t), H - B + 16, fmtTime(t), null, "middle");
    }
    el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis" }, svg);
    el("line", { x1: L, x2: L, y1: T, y2: H - B, "class": "axis" }, svg);
    return { sx: sx, sy: sy };
  }

  function nearest(ts, t) {
    var lo = 0, hi = ts.length - 1;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (ts[mid] < t) lo = mid + 1; else hi = mid; }
    if (lo > 0 && t - ts[lo - 1] < ts[lo] - t) lo--;
    return lo;
  }

  // Hover: a guide line and a tooltip built by `describe(i)` (a list of [label, value, class]).
  function hover(svg, sc, ts, tmax, describe) {
    var guide = el("line", { y1: T, y2: H - B, "class": "guide", visibility: "hidden" }, svg);
    svg.addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect();
      var x = (ev.clientX - box.left) * (W / box.width);
      if (x < L || x > W - R || !ts.length) { guide.setAttribute("visibility", "hidden"); tip.hidden = true; return; }
      var i = nearest(ts, ((x - L) / (W - L - R)) * tmax);
      guide.setAttribute("x1", sc.sx(ts[i])); guide.setAttribute("x2", sc.sx(ts[i]));
      guide.setAttribute("visibility", "visible");
      tip.textContent = "";
      describe(i).forEach(function (row) {
        var line = document.createElement("div");
        if (row[2]) { var sw = document.createElement("i"); sw.className = "dot " + row[2]; line.appendChild(sw); }
        line.appendChild(document.createTextNode(row[0] + " "));
        var b = document.createElement("b"); b.textContent = row[1]; line.appendChild(b);
        tip.appendChild(line);
      });
      tip.hidden = false;
      var left = ev.clientX + 14;
      if (left + tip.offsetWidth > window.innerWidth - 8) left = ev.clientX - 14 - tip.offsetWidth;
      tip.style.left = left + "px"; tip.style.top = (ev.clientY + 12) + "px";
    });
    svg.addEventListener("mouseleave", function () { guide.setAttribute("visibility", "hidden"); tip.hidden = true; });
  }

  function peakMark(svg, sc, t, label, strong) {
    var x = sc.sx(t);
    var line = el("line", { x1: x, x2: x, y1: T - 4, y2: H - B, "class": "peakline" }, svg);
    if (!strong) line.setAttribute("opacity", "0.45");
    var right = x > W * 0.7;
    var lab = text(svg, x + (right ? -6 : 6), T + 6, label, "peaklabel", right ? "end" : "start");
    if (!strong) lab.setAttribute("opacity", "0.6");
  }

  var tmaxAll = data.duration_ns;
  data.devices.forEach(function (d) { if (d.t.length) tmaxAll = Math.max(tmaxAll, d.t[d.t.length - 1]); });

  function deviceChart(d, host) {
    var box = document.createElement("div");
    box.className = "chart device-chart";
    var h = document.createElement("h3");
    h.textContent = d.device + " — peak " + fmtBytes(d.peak_bytes) + " at " + fmtTime(d.peak_ns) +
      (d.capacity ? " (capacity " + fmtBytes(d.capacity) + ")" : "");
    box.appendChild(h);
    var n = d.t.length, cats = data.categories;
    var totals = new Array(n).fill(0);
    for (var i = 0; i < n; i++) for (var c = 0; c < cats.length; c++) totals[i] += d.series[c][i];
    var ymax = Math.max(1, Math.max.apply(null, totals.concat([d.peak_bytes])) * 1.08);
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "memory of " + d.device });
    box.appendChild(svg);
    var sc = frame(svg, tmaxAll, ymax);
    var below = new Array(n).fill(0), drawn = 0, present = [];
    for (c = 0; c < cats.length; c++) {
      var s = d.series[c];
      if (!s.some(function (v) { return v > 0; })) continue;
      present.push(c);
      var top = [], bottom = [];
      for (i = 0; i < n; i++) {
        top.push(sc.sx(d.t[i]).toFixed(1) + "," + sc.sy(below[i] + s[i]).toFixed(1));
        bottom.push(sc.sx(d.t[i]).toFixed(1) + "," + sc.sy(below[i]).toFixed(1));
        below[i] += s[i];
      }
      var p = el("path", { d: "M" + top.join("L") + "L" + bottom.reverse().join("L") + "Z",
        fill: "var(--c" + c + ")", "fill-opacity": "0.85", stroke: "none", "data-category": cats[c] }, svg);
      p.setAttribute("data-points", String(n));
      drawn += n;
    }
    if (d.capacity && d.capacity <= ymax) {
      el("line", { x1: L, x2: W - R, y1: sc.sy(d.capacity), y2: sc.sy(d.capacity), "class": "cap" }, svg);
    }
    if (d.device === data.peak_device && data.peak_bytes > 0) {
      peakMark(svg, sc, data.peak_ns, "peak " + fmtBytes(data.peak_bytes) + " at " + fmtTime(data.peak_ns), true);
    } else if (d.peak_bytes > 0) {
      peakMark(svg, sc, d.peak_ns, "device peak " + fmtBytes(d.peak_bytes), false);
    }
    svg.setAttribute("data-points", String(drawn));
    box.setAttribute("data-points", String(n));
    hover(svg, sc, d.t, tmaxAll, function (i) {
      var rows = [[d.device + " at " + fmtTime(d.t[i]), fmtBytes(totals[i])]];
      present.slice().reverse().forEach(function (c) { rows.push([cats[c], fmtBytes(d.series[c][i]), "c" + c]); });
      return rows;
    });
    var legend = document.createElement("ul");
    legend.className = "legend";
    present.forEach(function (c) {
      var li = document.createElement("li"), sw = document.createElement("i");
      sw.className = "c" + c; li.appendChild(sw); li.appendChild(document.createTextNode(cats[c]));
      legend.appendChild(li);
    });
    box.appendChild(legend);
    host.appendChild(box);
  }

  function poolChart(p, host) {
    var box = document.createElement("div");
    box.className = "chart pool-chart";
    var h = document.createElement("h3");
    h.textContent = p.device + " pool — reserved bytes (area, left axis, capacity " + fmtBytes(p.capacity) +
      ") and fragmentation (line, right axis)";
    box.appendChild(h);
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "pool of " + p.device });
    box.appendChild(svg);
    var n = p.t.length, ymax = Math.max(1, p.capacity, Math.max.apply(null, p.reserved)) * 1.05;
    var sc = frame(svg, tmaxAll, ymax);
    var pts = [];
    for (var i = 0; i < n; i++) pts.push(sc.sx(p.t[i]).toFixed(1) + "," + sc.sy(p.reserved[i]).toFixed(1));
    el("path", { d: "M" + sc.sx(p.t[0]).toFixed(1) + "," + sc.sy(0) + "L" + pts.join("L") + "L" +
      sc.sx(p.t[n - 1]).toFixed(1) + "," + sc.sy(0) + "Z", fill: "var(--c0)", "fill-opacity": "0.35",
      stroke: "var(--c0)", "data-points": String(n) }, svg);
    el("line", { x1: L, x2: W - R, y1: sc.sy(p.capacity), y2: sc.sy(p.capacity), "class": "cap" }, svg);
    var fy = function (f) { return H - B - f * (H - T - B); };
    var fp = [];
    for (i = 0; i < n; i++) fp.push(sc.sx(p.t[i]).toFixed(1) + "," + fy(p.fragmentation[i]).toFixed(1));
    el("path", { d: "M" + fp.join("L"), fill: "none", stroke: "var(--c1)", "stroke-width": "1.2" }, svg);
    [0, 0.5, 1].forEach(function (f) { text(svg, W - R - 2, fy(f) - 3, Math.round(f * 100) + "%", null, "end"); });
    svg.setAttribute("data-points", String(n));
    hover(svg, sc, p.t, tmaxAll, function (i) {
      return [[p.device + " at " + fmtTime(p.t[i]), ""], ["reserved", fmtBytes(p.reserved[i]), "c0"],
        ["fragmentation", (p.fragmentation[i] * 100).toFixed(1) + "%", "c1"]];
    });
    host.appendChild(box);
  }

  // Per iteration: the change in live bytes as bars around zero (growth stands out), and the
  // live bytes at each end as a line on the same time order.
  function iterationChart(host) {
    var its = data.iterations;
    if (!its.length) return;
    var IH = 200;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + IH, role: "img", "aria-label": "change in live bytes per iteration" });
    // The first iteration allocates the optimizer state and the like; scaling to it would flatten
    // the rest, so with enough iterations the scale follows the others and it is clipped.
    var scaled = its.length > 2 ? its.slice(1) : its;
    var hi = Math.max(1, Math.max.apply(null, scaled.map(function (x) { return Math.abs(x[2]); }))) * 1.15;
    var mid = T + (IH - T - B) / 2, half = (IH - T - B) / 2;
    var sy = function (v) { return mid - (v / hi) * half; };
    var step = byteStep(hi, 3);
    for (var v = 0; v <= hi; v += step) {
      [v, -v].forEach(function (w) {
        el("line", { x1: L, x2: W - R, y1: sy(w), y2: sy(w), "class": w === 0 ? "axis" : "grid" }, svg);
        text(svg, L - 6, sy(w) + 4, (w > 0 ? "+" : w < 0 ? "-" : "") + fmtBytes(Math.abs(w)), null, "end");
      });
    }
    var bw = (W - L - R) / its.length;
    its.forEach(function (x, k) {
      var clipped = Math.abs(x[2]) > hi;
      var y0 = sy(0), y1 = sy(Math.max(-hi, Math.min(hi, x[2])));
      var r = el("rect", { x: (L + k * bw + bw * 0.15).toFixed(1), y: Math.min(y0, y1).toFixed(1),
        width: Math.max(1, bw * 0.7).toFixed(1), height: Math.max(0.5, Math.abs(y1 - y0)).toFixed(1),
        fill: x[2] > 0 ? "var(--c1)" : "var(--c2)" }, svg);
      var title = el("title", {}, r);
      title.textContent = "iteration " + x[0] + ": live " + fmtBytes(x[1]) + ", change " +
        (x[2] >= 0 ? "+" : "-") + fmtBytes(Math.abs(x[2]));
      if (clipped) text(svg, L + k * bw + bw * 0.85 + 4, x[2] > 0 ? T + 10 : IH - B - 4,
        (x[2] > 0 ? "↑ +" : "↓ -") + fmtBytes(Math.abs(x[2])), null, "start");
      if (its.length <= 40 || k % Math.ceil(its.length / 40) === 0) text(svg, L + k * bw + bw / 2, IH - B + 14, String(x[0]), null, "middle");
    });
    svg.setAttribute("data-points", String(its.length));
    host.appendChild(svg);
  }

  var timelines = document.getElementById("timelines");
  data.devices.forEach(function (d) { deviceChart(d, timelines); });
  if (!data.devices.length) {
    var none = document.createElement("p"); none.className = "note";
    none.textContent = "The profile holds no timeline points."; timelines.appendChild(none);
  }
  var pools = document.getElementById("pool-charts");
  data.pools.forEach(function (p) { poolChart(p, pools); });
  iterationChart(document.getElementById("iteration-chart"));

  // Sortable tables: numbers by data-v, text by content; click again to reverse.
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
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
          if (num) r = parseFloat(x.getAttribute("data-v")) - parseFloat(y.getAttribute("data-v"));
          else r = x.textContent.localeCompare(y.textContent);
          return desc ? -r : r;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });

  // Span tree: clicking a parent hides or shows everything below it.
  var tree = document.getElementById("span-table");
  if (tree) tree.tBodies[0].addEventListener("click", function (ev) {
    var row = ev.target.closest("tr.parent");
    if (!row) return;
    var depth = +row.getAttribute("data-depth"), hide = !row.classList.contains("collapsed");
    row.classList.toggle("collapsed", hide);
    for (var r = row.nextElementSibling; r && +r.getAttribute("data-depth") > depth; r = r.nextElementSibling) {
      r.hidden = hide;
      if (!hide) r.classList.remove("collapsed");
    }
  });
  document.body.setAttribute("data-rendered", "yes");
})();
