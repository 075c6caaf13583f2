// highwater report: the icicle of bytes live at the peak by stack (data.flame, built by
// flame.rs). Each frame hangs below its caller, as wide as the bytes allocated through it,
// coloured by the category most of them hold. Hover for a frame's figures, click to zoom into
// it (the frames above it then span the whole width), click the focused frame again to zoom
// out. Profile strings only reach the page through textContent.
(function () {
  "use strict";
  var host = document.getElementById("flame-chart");
  if (!host) return;
  var data = JSON.parse(document.getElementById("hw-data").textContent);
  var flame = data.flame;
  if (!flame || !flame.nodes.length) return;
  var SVG = "http://www.w3.org/2000/svg";
  var fmt = window.highwaterFormat.bytes;
  var nodes = flame.nodes, cats = data.categories, peak = data.peak_bytes;
  var tip = document.getElementById("tip"), detail = document.getElementById("flame-detail");
  var kids = nodes.map(function () { return []; }), depth = [];
  nodes.forEach(function (n, i) {
    depth[i] = n.p === null ? 0 : depth[n.p] + 1;
    if (n.p !== null) kids[n.p].push(i);
  });
  var rows = Math.max.apply(null, depth) + 1;
  // Drawn at the width it is shown at, one unit a pixel, so labels keep their 11 px.
  var W = Math.max(320, Math.round(host.clientWidth || 1000)), ROW = 20, H = rows * ROW;
  // Characters that fit in a frame of width w (11 px text, about 6.6 px a character).
  var CHAR = 6.6;

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function dominant(n) {
    var best = 0;
    for (var c = 1; c < n.c.length; c++) if (n.c[c] > n.c[best]) best = c;
    return best;
  }
  function pct(part, whole) { return whole > 0 ? (part * 100 / whole).toFixed(1) + "%" : "0.0%"; }
  // The function's own name first: `a::b::C::f` is labelled `C::f` when space is short, and
  // `<a::Linear as b::Module>::forward` is labelled `Linear::forward`.
  function shortName(f) {
    var as = f.indexOf(" as ");
    if (f.charAt(0) === "<" && as > 0 && f.lastIndexOf(">::") > as) {
      var ty = f.slice(1, as).split("::");
      return ty[ty.length - 1] + "::" + f.slice(f.lastIndexOf(">::") + 3);
    }
    var parts = f.split("::");
    return parts.length > 2 ? parts.slice(-2).join("::") : f;
  }
  // The longest of the full name, `Type::f` and the bare `f` that fits; a cut name only when
  // most of the bare name still shows (never `cont…`), else nothing (hover names it).
  function label(f, room) {
    if (f.length <= room) return f;
    var short = shortName(f);
    if (short.length <= room) return short;
    var bare = short.split("::").pop();
    if (bare.length <= room) return bare;
    return room >= 8 && room >= bare.length * 0.6 ? bare.slice(0, room - 1) + "…" : "";
  }
  function describe(n) {
    var lines = [n.f + (n.inl ? " (inlined)" : "")];
    if (n.at) lines.push("at " + n.at);
    lines.push(fmt(n.b) + " ± " + fmt(n.e) + " live at the peak (" + pct(n.b, peak) + " of the peak)");
    var mix = [];
    n.c.forEach(function (b, c) { if (b > 0) mix.push([b, c]); });
    mix.sort(function (a, b) { return b[0] - a[0]; });
    lines.push(mix.map(function (m) { return cats[m[1]] + " " + pct(m[0], n.b); }).join(", "));
    if (n.s.length) {
      var more = n.n > n.s.length ? " and " + (n.n - n.s.length) + " more" : "";
      lines.push((n.n === 1 ? "call site " : n.n + " call sites: ") +
        n.s.map(function (s) { return "#" + s; }).join(" ") + more);
    }
    return lines;
  }
  function showTip(ev, lines) {
    tip.textContent = "";
    lines.forEach(function (text, k) {
      var line = document.createElement("div");
      if (k === 0) { var b = document.createElement("b"); b.textContent = text; line.appendChild(b); }
      else line.textContent = text;
      tip.appendChild(line);
    });
    tip.hidden = false;
    var left = ev.clientX + 14;
    if (left + tip.offsetWidth > window.innerWidth - 8) left = Math.max(8, ev.clientX - 14 - tip.offsetWidth);
    tip.style.left = left + "px";
    tip.style.top = (ev.clientY + 12) + "px";
  }

  function draw(focus) {
    host.textContent = "";
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, "data-focus": focus, role: "img",
      "aria-label": "bytes live at the peak by call stack" }, host);
    var x = [], w = [];
    for (var a = focus; a !== null; a = nodes[a].p) { x[a] = 0; w[a] = W; }
    (function layout(i) {
      var cx = x[i];
      kids[i].forEach(function (k) {
        x[k] = cx;
        w[k] = nodes[focus].b > 0 ? nodes[k].b / nodes[focus].b * W : 0;
        cx += w[k];
        layout(k);
      });
    })(focus);
    var ancestor = {};
    for (var up = nodes[focus].p; up !== null; up = nodes[up].p) ancestor[up] = true;
    nodes.forEach(function (n, i) {
      if (w[i] === undefined || w[i] < 0.5) return;
      var g = el("g", { "class": "frame", "data-i": i }, svg);
      // The root (every site) is neutral; each frame takes its main category's colour.
      var colour = n.p === null ? "root" : "c" + dominant(n);
      var cls = "fl " + colour + (ancestor[i] ? " anc" : "") + (i === focus ? " focus" : "");
      el("rect", { x: x[i] + 0.5, y: depth[i] * ROW + 0.5, width: Math.max(0.5, w[i] - 1), height: ROW - 1,
        rx: 2, "class": cls }, g);
      var room = Math.floor((w[i] - 8) / CHAR), text = label(n.f, room);
      if (text) {
        var t = el("text", { x: x[i] + 4, y: depth[i] * ROW + 14, "class": "fltext" }, g);
        t.textContent = text;
        // The estimate is a guess at the font: measure, and shorten until it fits.
        while (text && t.getComputedTextLength() > w[i] - 6) {
          room = Math.min(room, text.length) - 1;
          text = label(n.f, room);
          t.textContent = text;
        }
        if (!text) g.removeChild(t);
      }
    });
    svg.addEventListener("mousemove", function (ev) {
      var g = ev.target.closest("g.frame");
      if (!g) { tip.hidden = true; return; }
      showTip(ev, describe(nodes[+g.getAttribute("data-i")]));
    });
    svg.addEventListener("mouseleave", function () { tip.hidden = true; });
    svg.addEventListener("click", function (ev) {
      var g = ev.target.closest("g.frame");
      if (!g) return;
      var i = +g.getAttribute("data-i");
      detail.textContent = describe(nodes[i]).join(" · ");
      // Clicking the focused frame zooms out to its caller; any other frame is zoomed into.
      var next = i;
      if (i === focus) next = nodes[i].p === null ? 0 : nodes[i].p;
      tip.hidden = true;
      draw(next);
    });
  }
  draw(0);
  if (flame.nodes_left_out > 0) {
    var note = document.createElement("p");
    note.className = "note";
    note.textContent = flame.nodes_left_out + " frames too narrow to draw are left out.";
    host.parentNode.insertBefore(note, host.nextSibling);
  }
})();
