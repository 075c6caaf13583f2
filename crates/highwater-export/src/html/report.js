// highwater report: draws the charts from the data island, zooms them, sorts tables, folds the
// span tree. Profile strings are user data: they only ever reach the page through textContent.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("hw-data").textContent);
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  // The same units and rounding as the Rust side's format_bytes and format_duration_ns.
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
  window.highwaterFormat = { bytes: fmtBytes, time: fmtTime };

  // Axis labels: one unit for the whole axis (from its largest value), as many decimals as the
  // tick step needs, and a bare "0" at the origin.
  function timeAxisFormat(max, step) {
    var units = [[1, "ns"], [1e3, "µs"], [1e6, "ms"], [1e9, "s"]], u = 0;
    while (u < units.length - 1 && max >= units[u + 1][0]) u++;
    var scale = units[u][0], name = units[u][1];
    var decimals = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / scale) - 1e-9)));
    return function (t) { return t === 0 ? "0" : (t / scale).toFixed(decimals) + " " + name; };
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
  function div(cls, parent) {
    var d = document.createElement("div");
    if (cls) d.className = cls;
    if (parent) parent.appendChild(d);
    return d;
  }
  // A "nice" axis step in binary units (1, 2, 5 × 1024^k bytes) for about `count` ticks.
  function byteStep(max, count) {
    var unit = 1;
    while (max / unit >= 1024 * count && unit < Math.pow(1024, 6)) unit *= 1024;
    var steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1024];
    for (var i = 0; i < steps.length; i++) if (max / (steps[i] * unit) <= count) return steps[i] * unit;
    return 1024 * unit;
  }
  function niceStep(span, count) {
    var raw = span / count, p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var m = [1, 2, 5, 10];
    for (var i = 0; i < m.length; i++) if (m[i] * p >= raw) return m[i] * p;
    return 10 * p;
  }

  // Charts are drawn at the width they are shown at, one unit a pixel, so their text keeps its
  // size (11 px) on a narrow screen instead of shrinking with a scaled drawing.
  var host0 = document.getElementById("timelines");
  var W = Math.max(320, Math.round((host0 && host0.clientWidth) || 1000)), L = 78, R = 16, B = 26;
  // Time ticks: about one per 110 px.
  var TICKS = Math.max(3, Math.floor((W - L - R) / 110));
  var tip = document.getElementById("tip");
  var tEnd = data.duration_ns;
  data.devices.forEach(function (d) { if (d.t.length) tEnd = Math.max(tEnd, d.t[d.t.length - 1]); });

  // Axes and grid for time [t0, t1] and values [0, ymax] in the plot box [top, H - B].
  function frame(svg, H, top, t0, t1, ymax, yfmt) {
    var span = Math.max(1, t1 - t0);
    var sx = function (t) { return L + ((Math.min(Math.max(t, t0), t1) - t0) / span) * (W - L - R); };
    var sy = function (v) { return H - B - (ymax > 0 ? (v / ymax) * (H - top - B) : 0); };
    var ys = yfmt === "pct" ? 0.25 : byteStep(ymax, 4);
    for (var v = 0; v <= ymax + 1e-9; v += ys) {
      el("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), "class": "grid" }, svg);
      text(svg, L - 6, sy(v) + 4, yfmt === "pct" ? Math.round(v * 100) + "%" : fmtBytes(v), "ylabel", "end");
    }
    // Zoomed far from the origin, ticks read as offsets from the range's start ("+2 ms"),
    // which the first label names; otherwise as times since the run started.
    var ts = niceStep(span, TICKS), relative = t0 > 0 && span * 5 < t1;
    var label = timeAxisFormat(relative ? span : t1, ts);
    var first = relative ? t0 : Math.ceil(t0 / ts) * ts;
    for (var t = first; t <= t1 + ts * 1e-9; t += ts) {
      el("line", { x1: sx(t), x2: sx(t), y1: H - B, y2: H - B + 4, "class": "axis" }, svg);
      var words = relative ? (t === t0 ? fmtTime(t0) : "+" + label(t - t0)) : label(t);
      text(svg, sx(t), H - B + 16, words, "xlabel", t === t0 && relative ? "start" : "middle");
    }
    el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis" }, svg);
    el("line", { x1: L, x2: L, y1: top, y2: H - B, "class": "axis" }, svg);
    return { sx: sx, sy: sy, t0: t0, t1: t1, top: top, bottom: H - B,
      tAt: function (x) { return t0 + ((x - L) / (W - L - R)) * span; } };
  }

  // Index of the last point at or before t (0 if none).
  function before(ts, t) {
    var lo = 0, hi = ts.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (ts[mid] <= t) lo = mid + 1; else hi = mid; }
    return Math.max(0, lo - 1);
  }

  // A stepped outline: each value holds until the next point; `top(i)` and `bottom(i)` in px.
  function stepPath(sc, ts, i0, i1, until, top, bottom) {
    var up = [], down = [];
    for (var i = i0; i <= i1; i++) {
      var x0 = sc.sx(ts[i]).toFixed(1), x1 = sc.sx(i < i1 ? ts[i + 1] : until).toFixed(1);
      up.push(x0 + "," + top(i).toFixed(1), x1 + "," + top(i).toFixed(1));
      down.push(x0 + "," + bottom(i).toFixed(1), x1 + "," + bottom(i).toFixed(1));
    }
    return "M" + up.join("L") + "L" + down.reverse().join("L") + "Z";
  }

  // Hover: a guide line and a tooltip built by `describe(i)` (a list of [label, value, class]).
  function hover(svg, state, ts, describe) {
    svg.addEventListener("mousemove", function (ev) {
      var sc = state.sc, guide = state.guide;
      if (!sc || state.dragging) return;
      var box = svg.getBoundingClientRect();
      var x = (ev.clientX - box.left) * (W / box.width);
      if (x < L || x > W - R || !ts.length) { guide.setAttribute("visibility", "hidden"); tip.hidden = true; return; }
      var i = before(ts, sc.tAt(x));
      guide.setAttribute("x1", x); guide.setAttribute("x2", x);
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
    svg.addEventListener("mouseleave", function () { if (state.guide) state.guide.setAttribute("visibility", "hidden"); tip.hidden = true; });
  }

  // Brush: drag across the plot to choose [t0, t1]; `zoom(t0, t1)` applies it.
  function brush(svg, state, zoom) {
    var start = null, rect = null;
    function xOf(ev) { var box = svg.getBoundingClientRect(); return Math.min(W - R, Math.max(L, (ev.clientX - box.left) * (W / box.width))); }
    svg.addEventListener("mousedown", function (ev) {
      if (!state.sc) return;
      start = xOf(ev); state.dragging = true;
      rect = el("rect", { x: start, y: state.sc.top, width: 0, height: state.sc.bottom - state.sc.top, "class": "brush" }, svg);
      ev.preventDefault();
    });
    window.addEventListener("mousemove", function (ev) {
      if (start === null) return;
      var x = xOf(ev);
      rect.setAttribute("x", Math.min(start, x)); rect.setAttribute("width", Math.abs(x - start));
    });
    window.addEventListener("mouseup", function (ev) {
      if (start === null) return;
      var x = xOf(ev), a = Math.min(start, x), b = Math.max(start, x);
      start = null; state.dragging = false;
      if (rect && rect.parentNode) rect.parentNode.removeChild(rect);
      if (b - a >= 4) {
        var t0 = state.sc.tAt(a), t1 = state.sc.tAt(b);
        if (t1 - t0 >= 1) zoom(t0, t1);
      }
    });
  }

  function peakMark(svg, sc, t, label, strong) {
    if (t < sc.t0 || t > sc.t1) return;
    var x = sc.sx(t);
    var line = el("line", { x1: x, x2: x, y1: sc.top - 4, y2: sc.bottom, "class": "peakline" }, svg);
    if (!strong) line.setAttribute("opacity", "0.45");
    var right = x > W * 0.7;
    var lab = text(svg, x + (right ? -6 : 6), sc.top + 8, label, "peaklabel", right ? "end" : "start");
    if (!strong) lab.setAttribute("opacity", "0.6");
  }

  // Refused allocations on `device` inside the chart's range, as marks.
  function oomMarks(svg, sc, device) {
    (data.ooms || []).forEach(function (o) {
      if (o.device !== device || o.t < sc.t0 || o.t > sc.t1) return;
      var x = sc.sx(o.t);
      el("line", { x1: x, x2: x, y1: sc.top - 4, y2: sc.bottom, "class": "oomline" }, svg);
      var right = x > W * 0.7;
      text(svg, x + (right ? -6 : 6), sc.top + 22, o.label, "oomlabel", right ? "end" : "start");
    });
  }

  var BAND = 15, MAX_BAND_ROWS = 8;
  var bandColors = ["#dbe6f1", "#fde3c8", "#d9ecd5", "#eadcea", "#e4e6e8"];

  // A device's memory as stacked category areas over [view.t0, view.t1], with optional span
  // bands above the curve. Returns the chart; `draw(t0, t1)` redraws it for a time range.
  function stackedChart(host, d, options) {
    var box = div("chart " + options.cls, host);
    var h = document.createElement("h3");
    h.textContent = options.title;
    box.appendChild(h);
    var cats = data.categories, n = d.t.length;
    var totals = new Array(n).fill(0);
    for (var i = 0; i < n; i++) for (var c = 0; c < cats.length; c++) totals[i] += d.series[c][i];
    var present = [];
    for (c = 0; c < cats.length; c++) if (d.series[c].some(function (v) { return v > 0; })) present.push(c);
    var bands = options.bands || [], rows = {}, rowCount = 0;
    bands.slice().sort(function (a, b) { return a.thread - b.thread || a.depth - b.depth; }).forEach(function (s) {
      var key = s.thread + ":" + s.depth;
      if (!(key in rows) && rowCount < MAX_BAND_ROWS) rows[key] = rowCount++;
    });
    var T = 18 + rowCount * BAND + (rowCount ? 8 : 0), H = T + 232;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": options.title }, null);
    box.appendChild(svg);
    var state = { sc: null, guide: null, dragging: false };
    var chart = { box: box, svg: svg };
    // Points i0..i1 in `columns` equal time columns over [t0, t1]: each column's start time and
    // the points of the highest and the lowest total in it (the level carried into a column
    // counts as one of its points).
    function envelope(i0, i1, t0, t1, columns) {
      var width = (t1 - t0) / columns, t = [], hi = [], lo = [], i = i0;
      for (var k = 0; k < columns; k++) {
        var start = t0 + width * k, end = start + width;
        var h = Math.max(i0, before(d.t, start)), l = h;
        while (i <= i1 && d.t[i] <= start) i++;
        for (; i <= i1 && d.t[i] < end; i++) {
          if (totals[i] > totals[h]) h = i;
          if (totals[i] < totals[l]) l = i;
        }
        t.push(start); hi.push(h); lo.push(l);
      }
      return { t: t, hi: hi, lo: lo };
    }
    chart.draw = function (t0, t1) {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      var i0 = before(d.t, t0), i1 = Math.max(i0, before(d.t, t1));
      var ymax = 1;
      for (var i = i0; i <= i1; i++) ymax = Math.max(ymax, totals[i]);
      if (d.peak_ns >= t0 && d.peak_ns <= t1) ymax = Math.max(ymax, d.peak_bytes);
      var rv = d.reserved, r0 = 0, r1 = -1;
      if (rv && rv.t.length) {
        r0 = before(rv.t, t0); r1 = Math.max(r0, before(rv.t, t1));
        for (var j = r0; j <= r1; j++) ymax = Math.max(ymax, rv.bytes[j]);
      }
      ymax *= 1.08;
      var sc = frame(svg, H, T, t0, t1, ymax);
      state.sc = sc;
      var until = Math.min(t1, Math.max(tEnd, d.t[n - 1]));
      var drawn = 0;
      // Stacked category areas over columns `ts` (a column's value holds until the next):
      // `at(k)` is the point column k shows.
      function stacks(ts, k0, k1, at, opacity, cls) {
        var below = new Array(ts.length).fill(0);
        present.forEach(function (c) {
          var s = d.series[c], base = below.slice();
          for (var k = k0; k <= k1; k++) below[k] += s[at(k)];
          var p = el("path", { d: stepPath(sc, ts, k0, k1, until, function (k) { return sc.sy(base[k] + s[at(k)]); },
            function (k) { return sc.sy(base[k]); }), fill: "var(--c" + c + ")", "fill-opacity": opacity,
            stroke: "none", "data-category": cats[c], "class": cls }, svg);
          p.setAttribute("data-points", String(k1 - k0 + 1));
          drawn += k1 - k0 + 1;
        });
      }
      var columns = Math.floor((W - L - R) / 2);
      var env = options.envelope && i1 - i0 + 1 > columns ? envelope(i0, i1, t0, t1, columns) : null;
      if (env) {
        // More points than pixels: each column shows the highest its range reached (pale) over
        // the lowest (solid), so swings read as a band, not a comb of spikes.
        stacks(env.t, 0, env.t.length - 1, function (k) { return env.hi[k]; }, "0.4", "env-high");
        stacks(env.t, 0, env.t.length - 1, function (k) { return env.lo[k]; }, "0.9", "env-low");
      } else {
        stacks(d.t, i0, i1, function (i) { return i; }, "0.85", "steps");
      }
      svg.setAttribute("data-envelope", env ? "yes" : "no");
      if (d.capacity && d.capacity <= ymax) {
        el("line", { x1: L, x2: W - R, y1: sc.sy(d.capacity), y2: sc.sy(d.capacity), "class": "cap" }, svg);
      }
      if (r1 >= r0) {
        // What the driver's pools hold: a stepped line over the allocated bytes.
        var pts = [], rUntil = Math.min(t1, Math.max(tEnd, rv.t[rv.t.length - 1]));
        for (var k = r0; k <= r1; k++) {
          var y = sc.sy(rv.bytes[k]).toFixed(1);
          pts.push(sc.sx(Math.max(t0, rv.t[k])).toFixed(1) + "," + y,
            sc.sx(k < r1 ? rv.t[k + 1] : rUntil).toFixed(1) + "," + y);
        }
        el("polyline", { points: pts.join(" "), "class": "reserved", "data-points": String(r1 - r0 + 1) }, svg);
      }
      bands.forEach(function (s) {
        var row = rows[s.thread + ":" + s.depth];
        if (row === undefined || s.end < t0 || s.start > t1) return;
        var x0 = sc.sx(s.start), x1 = sc.sx(s.end), y = 14 + row * BAND;
        var r = el("rect", { x: x0.toFixed(1), y: y, width: Math.max(1, x1 - x0).toFixed(1), height: BAND - 3,
          fill: bandColors[s.depth % bandColors.length], stroke: "#9aa5b1", "stroke-width": "0.5", "class": "band" }, svg);
        var title = el("title", {}, r);
        title.textContent = s.path + " (thread " + s.thread + "): " + fmtTime(s.end - s.start);
        if (x1 - x0 > 8 * Math.min(s.name.length, 24) + 8) {
          var label = text(svg, x0 + 4, y + BAND - 6, s.name.length > 24 ? s.name.slice(0, 23) + "…" : s.name, "bandlabel");
          label.setAttribute("pointer-events", "none");
        }
      });
      if (d.device === data.peak_device && data.peak_bytes > 0) {
        peakMark(svg, sc, data.peak_ns, "peak " + fmtBytes(data.peak_bytes) + " at " + fmtTime(data.peak_ns), true);
      } else if (d.peak_bytes > 0) {
        peakMark(svg, sc, d.peak_ns, "device peak " + fmtBytes(d.peak_bytes), false);
      }
      oomMarks(svg, sc, d.device);
      state.guide = el("line", { y1: T, y2: H - B, "class": "guide", visibility: "hidden" }, svg);
      svg.setAttribute("data-points", String(drawn));
      svg.setAttribute("data-t0", String(Math.round(t0)));
      svg.setAttribute("data-t1", String(Math.round(t1)));
      box.setAttribute("data-points", String(n));
    };
    hover(svg, state, d.t, function (i) {
      var rows = [[d.device + " at " + fmtTime(d.t[i]), fmtBytes(totals[i])]];
      present.slice().reverse().forEach(function (c) { rows.push([cats[c], fmtBytes(d.series[c][i]), "c" + c]); });
      return rows;
    });
    brush(svg, state, options.zoom);
    var legend = document.createElement("ul");
    legend.className = "legend";
    present.forEach(function (c) {
      var li = document.createElement("li"), sw = document.createElement("i");
      sw.className = "c" + c; li.appendChild(sw); li.appendChild(document.createTextNode(cats[c]));
      legend.appendChild(li);
    });
    if (options.envelope) {
      var key = document.createElement("li");
      key.className = "envelope-key";
      key.textContent = "zoomed out, pale: the highest each moment reached; solid: the lowest";
      legend.appendChild(key);
    }
    if (d.reserved && d.reserved.t.length) {
      var li = document.createElement("li"), sw = document.createElement("i");
      sw.className = "reserved-swatch"; li.appendChild(sw);
      li.appendChild(document.createTextNode("reserved by the driver's pools (line)"));
      legend.appendChild(li);
    }
    box.appendChild(legend);
    return chart;
  }

  function poolChart(p, host, zoom) {
    var box = div("chart pool-chart", host), H = 250, T = 18;
    var h = document.createElement("h3");
    h.textContent = p.device + " pool — reserved bytes (area, left axis, capacity " + fmtBytes(p.capacity) +
      ") and fragmentation (line, right axis)";
    box.appendChild(h);
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "pool of " + p.device });
    box.appendChild(svg);
    var n = p.t.length, ymax = Math.max(1, p.capacity, Math.max.apply(null, p.reserved)) * 1.05;
    var state = { sc: null, guide: null, dragging: false };
    var chart = { box: box, svg: svg };
    chart.draw = function (t0, t1) {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      var sc = frame(svg, H, T, t0, t1, ymax), i0 = before(p.t, t0), i1 = Math.max(i0, before(p.t, t1));
      state.sc = sc;
      var until = Math.min(t1, Math.max(tEnd, p.t[n - 1]));
      el("path", { d: stepPath(sc, p.t, i0, i1, until, function (i) { return sc.sy(p.reserved[i]); },
        function () { return sc.sy(0); }), fill: "var(--c0)", "fill-opacity": "0.35", stroke: "var(--c0)",
        "data-points": String(i1 - i0 + 1) }, svg);
      el("line", { x1: L, x2: W - R, y1: sc.sy(p.capacity), y2: sc.sy(p.capacity), "class": "cap" }, svg);
      var fy = function (f) { return H - B - f * (H - T - B); }, fp = [];
      for (var i = i0; i <= i1; i++) {
        var x0 = sc.sx(p.t[i]).toFixed(1), x1 = sc.sx(i < i1 ? p.t[i + 1] : until).toFixed(1);
        fp.push(x0 + "," + fy(p.fragmentation[i]).toFixed(1), x1 + "," + fy(p.fragmentation[i]).toFixed(1));
      }
      el("path", { d: "M" + fp.join("L"), fill: "none", stroke: "var(--c1)", "stroke-width": "1.2" }, svg);
      [0, 0.5, 1].forEach(function (f) { text(svg, W - R - 2, fy(f) - 3, Math.round(f * 100) + "%", null, "end"); });
      oomMarks(svg, sc, p.device);
      state.guide = el("line", { y1: T, y2: H - B, "class": "guide", visibility: "hidden" }, svg);
      svg.setAttribute("data-points", String(n));
      svg.setAttribute("data-t0", String(Math.round(t0)));
      svg.setAttribute("data-t1", String(Math.round(t1)));
    };
    hover(svg, state, p.t, function (i) {
      return [[p.device + " at " + fmtTime(p.t[i]), ""], ["reserved", fmtBytes(p.reserved[i]), "c0"],
        ["fragmentation", (p.fragmentation[i] * 100).toFixed(1) + "%", "c1"]];
    });
    brush(svg, state, zoom);
    return chart;
  }

  // Per iteration: the change in live bytes as bars around zero (growth stands out).
  function iterationChart(host) {
    var its = data.iterations;
    if (!its.length) return;
    var IH = 200, T = 18;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + IH, role: "img", "aria-label": "change in live bytes per iteration" });
    // The first iteration allocates the optimizer state and the like; scaling to it would flatten
    // the rest, so with enough iterations the scale follows the others and it is clipped.
    var scaled = its.length > 2 ? its.slice(1) : its;
    var hi = Math.max(1, Math.max.apply(null, scaled.map(function (x) { return Math.abs(x[2]); }))) * 1.15;
    var mid = T + (IH - T - B) / 2, half = (IH - T - B) / 2;
    var sy = function (v) { return mid - (v / hi) * half; };
    var step = byteStep(hi, 2);
    for (var v = 0; v <= hi; v += step) {
      (v === 0 ? [0] : [v, -v]).forEach(function (w) {
        el("line", { x1: L, x2: W - R, y1: sy(w), y2: sy(w), "class": w === 0 ? "axis" : "grid" }, svg);
        text(svg, L - 6, sy(w) + 4, (w > 0 ? "+" : w < 0 ? "-" : "") + fmtBytes(Math.abs(w)), "ylabel", "end");
      });
    }
    var bw = (W - L - R) / its.length;
    // Label every k-th iteration, k a 1-2-5 step that leaves room for the widest label.
    var widest = String(its[its.length - 1][0]).length * 7 + 10, every = 1, k125 = 0;
    while (every * bw < widest) { k125++; every = [1, 2, 5][k125 % 3] * Math.pow(10, Math.floor(k125 / 3)); }
    its.forEach(function (x, k) {
      var clipped = Math.abs(x[2]) > hi;
      var y0 = sy(0), y1 = sy(Math.max(-hi, Math.min(hi, x[2])));
      var r = el("rect", { x: (L + k * bw + bw * 0.15).toFixed(1), y: Math.min(y0, y1).toFixed(1),
        width: Math.max(1, bw * 0.7).toFixed(1), height: Math.max(0.5, Math.abs(y1 - y0)).toFixed(1),
        fill: x[2] > 0 ? "var(--c1)" : "var(--c2)" }, svg);
      var title = el("title", {}, r);
      title.textContent = "iteration " + x[0] + ": live " + fmtBytes(x[1]) + ", change " +
        (x[2] >= 0 ? "+" : "-") + fmtBytes(Math.abs(x[2]));
      if (clipped && k === 0) text(svg, L + k * bw + bw + 4, x[2] > 0 ? T + 10 : IH - B - 4,
        (x[2] > 0 ? "↑ +" : "↓ -") + fmtBytes(Math.abs(x[2])), null, "start");
      if (x[0] % every === 0) text(svg, L + k * bw + bw / 2, IH - B + 14, String(x[0]), "xlabel", "middle");
    });
    svg.setAttribute("data-points", String(its.length));
    host.appendChild(svg);
  }

  // Device and pool charts share one time range; dragging across any of them zooms them all.
  var timelines = document.getElementById("timelines"), shared = [];
  var reset = document.getElementById("zoom-reset"), rangeNote = document.getElementById("zoom-range");
  function zoomAll(t0, t1) {
    shared.forEach(function (c) { c.draw(t0, t1); });
    var whole = t0 <= 0 && t1 >= tEnd;
    reset.disabled = whole;
    rangeNote.textContent = whole ? "" : "showing " + fmtTime(t0) + " to " + fmtTime(t1) + " of " + fmtTime(tEnd);
  }
  reset.addEventListener("click", function () { zoomAll(0, tEnd); });
  data.devices.forEach(function (d) {
    shared.push(stackedChart(timelines, d, { cls: "device-chart", zoom: zoomAll, envelope: true,
      title: d.device + " — peak " + fmtBytes(d.peak_bytes) + " at " + fmtTime(d.peak_ns) +
        (d.reserved && d.reserved.bytes.length ?
          ", reserved up to " + fmtBytes(Math.max.apply(null, d.reserved.bytes)) : "") +
        (d.capacity ? " (capacity " + fmtBytes(d.capacity) + ")" : "") }));
  });
  if (!data.devices.length) {
    var none = document.createElement("p"); none.className = "note";
    none.textContent = "The profile holds no timeline points."; timelines.appendChild(none);
  } else if (data.devices_not_charted) {
    var more = document.createElement("p"); more.className = "note";
    more.textContent = data.devices_not_charted + " more devices are not charted; the devices table lists them.";
    timelines.appendChild(more);
  }
  var pools = document.getElementById("pool-charts");
  data.pools.forEach(function (p) { shared.push(poolChart(p, pools, zoomAll)); });
  zoomAll(0, tEnd);

  // The step that peaked: its own chart and zoom, opened on the whole step.
  var stepHost = document.getElementById("peak-step-chart"), ps = data.peak_step;
  if (ps) {
    var stepChart = stackedChart(stepHost, ps.curve, { cls: "peak-step", bands: ps.spans,
      title: ps.curve.device + ", " + ps.label + ": " + fmtTime(ps.t1 - ps.t0) + " from " + fmtTime(ps.t0),
      zoom: function (t0, t1) { stepChart.draw(t0, t1); stepReset.disabled = false; } });
    var bar = div("toolbar", stepHost), stepReset = document.createElement("button");
    stepReset.type = "button"; stepReset.textContent = "Reset zoom"; stepReset.disabled = true;
    stepReset.addEventListener("click", function () { stepChart.draw(ps.t0, ps.t1); stepReset.disabled = true; });
    bar.appendChild(stepReset);
    if (ps.spans_not_drawn) {
      var note = document.createElement("span"); note.className = "note";
      note.textContent = " " + ps.spans_not_drawn + " shorter or deeper span instances are not drawn.";
      bar.appendChild(note);
    }
    stepChart.draw(ps.t0, ps.t1);
  } else {
    var nostep = document.createElement("p"); nostep.className = "note";
    nostep.textContent = "No iteration or top-level span holds the peak, so there is no step to zoom into.";
    stepHost.appendChild(nostep);
  }
  iterationChart(document.getElementById("iteration-chart"));

  // Long tables show their first rows and fold the rest (and rows holding nothing at the peak)
  // until "Show all"; the rows shown are the first ones in the current order.
  function limit(table) {
    var shown = +table.getAttribute("data-shown") || 12, all = table.classList.contains("all"), k = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var fold = !all && (row.classList.contains("zero") || k >= shown);
      if (!row.classList.contains("zero")) k++;
      row.classList.toggle("more", fold);
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("button.show-all"), function (button) {
    var table = document.getElementById(button.getAttribute("data-table")), label = button.textContent;
    if (!table) return;
    button.addEventListener("click", function () {
      var all = table.classList.toggle("all");
      button.textContent = all ? "Show fewer" : label;
      limit(table);
    });
  });
  // A link to a folded row (a site of a live-at-peak row) shows the whole table first.
  window.addEventListener("hashchange", unfoldTarget);
  function unfoldTarget() {
    var row = location.hash && document.getElementById(location.hash.slice(1));
    var table = row && row.closest && row.closest("table.limited");
    if (table && row.classList.contains("more")) {
      table.classList.add("all");
      limit(table);
      var button = document.querySelector("button.show-all[data-table='" + table.id + "']");
      if (button) button.textContent = "Show fewer";
      row.scrollIntoView();
    }
  }
  unfoldTarget();

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
        if (table.classList.contains("limited")) limit(table);
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
