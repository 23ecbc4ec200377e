// FedCure live view: reads /events (server-sent events) and draws the run. No dependencies.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const suffix = token ? "?token=" + encodeURIComponent(token) : "";
  const COLORS = ["#4f46e5", "#0a7d32", "#d97706", "#b42318", "#0891b2", "#7c3aed",
                  "#be185d", "#4d7c0f", "#475569", "#c2410c"];
  const SVGNS = "http://www.w3.org/2000/svg";
  // what the title says of each mode (the run's kind)
  const MODES = {simulation: "simulation, simulated clock", deployment: "deployment",
                 testbed: "testbed: emulated devices and links"};
  let rows = [];  // every round seen, as objects

  const $ = (id) => document.getElementById(id);
  const color = (m) => COLORS[m % COLORS.length];
  const fmt = (x, d) => (x === null || x === undefined || !isFinite(x)) ? "-" : Number(x).toFixed(d);
  const secs = (x) => (x === null || x === undefined) ? "-" : (x < 120 ? x.toFixed(1) + " s" : (x / 60).toFixed(1) + " min");

  function el(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // one mark of a series: a dot (a measurement) or a short bar (an estimate)
  function mark(svg, kind, x, y, c) {
    if (kind === "tick") svg.appendChild(el("line", {x1: x - 6, y1: y, x2: x + 6, y2: y, stroke: c, "stroke-width": 2.4, class: "mark-tick"}));
    else svg.appendChild(el("circle", {cx: x, cy: y, r: 2.6, fill: c, class: "mark-dot"}));
  }

  // x positions of the axis ticks: integers for a round axis (opts.xint), else quarters
  function xticks(x0, x1, xint) {
    if (!xint) return [0, 1, 2, 3, 4].map((i) => x0 + (x1 - x0) * i / 4);
    const step = Math.max(1, Math.ceil((x1 - x0) / 4)), out = [];
    for (let x = Math.ceil(x0); x <= x1 + 1e-9; x += step) out.push(x);
    return out;
  }

  // a y tick label short enough for the left margin: as many decimals as the tick step needs
  // (at most 3), powers of ten below that, thousands as "k"
  function ylabel(y, step) {
    if (Math.abs(y) >= 10000) return +(y / 1000).toPrecision(3) + "k";
    if (step > 0 && step < 0.001) return y === 0 ? "0" : y.toExponential(1);
    const decimals = step > 0 ? Math.min(3, Math.max(0, 1 - Math.floor(Math.log10(step)))) : 2;
    return String(+y.toFixed(decimals));
  }

  // a line/point chart: series = [{color, points: [[x, y]], dash, marker: "dot"|"tick", label}];
  // opts.xint: integer x ticks; opts.legend: [{color, marker: "dot"|"tick"|"line", label}]
  // drawn instead of the series' labels
  function chart(svg, series, xlabel, ymin, yfmt, opts) {
    opts = opts || {};
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = svg.clientWidth || 440, H = svg.clientHeight || 230, L = 48, R = 10, T = 10, B = 30;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const pts = series.flatMap((s) => s.points);
    if (!pts.length) { svg.appendChild(el("text", {x: L, y: H / 2}, "no rounds yet")); return; }
    let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
    let y0 = ymin !== undefined ? Math.min(ymin, ...pts.map((p) => p[1])) : Math.min(...pts.map((p) => p[1]));
    let y1 = Math.max(...pts.map((p) => p[1]));
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) y1 = y0 + 1;
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    svg.appendChild(el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d7dbe2"}));
    svg.appendChild(el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#d7dbe2"}));
    for (let i = 0; i <= 4; i++) {
      const y = y0 + (y1 - y0) * i / 4;
      svg.appendChild(el("text", {x: L - 4, y: sy(y) + 4, "text-anchor": "end"}, yfmt ? yfmt(y) : ylabel(y, (y1 - y0) / 4)));
    }
    const xs = xticks(x0, x1, opts.xint);
    xs.forEach((x, i) => {
      // the last label ends at its tick, so that it stays inside the chart
      const anchor = (i === xs.length - 1 && sx(x) > W - R - 20) ? "end" : "middle";
      svg.appendChild(el("text", {x: sx(x), y: H - B + 14, "text-anchor": anchor, class: "xtick"},
                         opts.xint ? String(x) : +x.toPrecision(3)));
    });
    svg.appendChild(el("text", {x: W - R, y: H - 2, "text-anchor": "end", class: "xlabel"}, xlabel));
    series.forEach((s) => {
      if (s.points.length > 1) {
        const d = s.points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
        const a = {d: d, fill: "none", stroke: s.color, "stroke-width": s.marker ? 1 : 1.6};
        if (s.dash) a["stroke-dasharray"] = "5 4";
        if (!s.marker || s.dash) svg.appendChild(el("path", a));
      }
      if (s.marker || s.points.length === 1) {
        s.points.forEach((p) => mark(svg, s.marker || "dot", sx(p[0]), sy(p[1]), s.color));
      }
    });
    const legend = opts.legend || series.filter((s) => s.label).map((s) => ({color: s.color, marker: "line", label: s.label}));
    let lx = L + 8;
    legend.forEach((g) => {
      if (g.marker === "line") svg.appendChild(el("rect", {x: lx, y: T, width: 10, height: 3, fill: g.color}));
      else mark(svg, g.marker, lx + 5, T + 1.5, g.color);
      svg.appendChild(el("text", {x: lx + 13, y: T + 5, class: "legend"}, g.label));
      lx += 22 + 6.2 * g.label.length;
    });
  }

  function bars(svg, groups) {  // groups: [{label, a, b, color}] a = share, b = delta
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = svg.clientWidth || 440, H = svg.clientHeight || 230, L = 40, B = 30, T = 18;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    if (!groups.length) { svg.appendChild(el("text", {x: L, y: H / 2}, "not formed yet")); return; }
    const top = Math.max(0.01, ...groups.map((g) => Math.max(g.a, g.b)));
    const gw = (W - L - 10) / groups.length, bw = Math.min(28, gw / 3);
    const sy = (y) => H - B - y / top * (H - T - B);
    svg.appendChild(el("line", {x1: L, y1: H - B, x2: W - 10, y2: H - B, stroke: "#d7dbe2"}));
    for (let i = 0; i <= 2; i++) {
      const y = top * i / 2;
      svg.appendChild(el("text", {x: L - 4, y: sy(y) + 4, "text-anchor": "end"}, y.toFixed(2)));
    }
    groups.forEach((g, i) => {
      const x = L + gw * i + gw / 2 - bw;
      svg.appendChild(el("rect", {x: x, y: sy(g.a), width: bw, height: H - B - sy(g.a), fill: g.color}));
      svg.appendChild(el("rect", {x: x + bw, y: sy(g.b), width: bw, height: H - B - sy(g.b), fill: "none", stroke: g.color, "stroke-dasharray": "3 2"}));
      svg.appendChild(el("text", {x: x + bw, y: H - B + 14, "text-anchor": "middle"}, g.label));
    });
    svg.appendChild(el("text", {x: L + 4, y: 12, class: "legend"}, "filled: share of rounds · dashed: target δ"));
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function render(s) {
    const mode = s.mode || (s.source === "simulation" ? "simulation" : "deployment");
    $("source").textContent = "(" + (MODES[mode] || mode) + ")";
    document.title = "FedCure live view: " + mode;
    document.body.dataset.mode = mode;
    $("phase").textContent = s.phase;
    $("round").textContent = s.round;
    $("global-rounds").textContent = s.global_rounds;
    $("version").textContent = s.version;
    $("clients").textContent = s.clients_registered + " / " + s.expected_clients;
    $("edges").textContent = s.edges_connected + " / " + s.num_edges;
    $("elapsed").textContent = secs(s.elapsed_s);
    $("accuracy").textContent = s.accuracy === null ? "-" : (100 * s.accuracy).toFixed(2) + " %" +
      (s.evaluation === "federated" ? " (federated" + (s.evaluation_clients === null ? "" :
        ": " + s.evaluation_clients + " clients, " + s.evaluation_samples + " held-out samples") + ")" : "");
    $("clock").textContent = s.clock === "simulated" ? "simulated" : "wall-clock";
    document.body.dataset.round = s.round;
    document.body.dataset.phase = s.phase;

    // a client as the page shows it: its registered name and id, "client-03 (#3)" (the id
    // alone where the run has no names); by default one unbreakable label, so that a list
    // wraps between clients (space: what goes between the name and the id instead)
    const names = {};
    s.clients.forEach((c) => { if (c.name) names[c.client] = c.name; });
    const who = (id, space) => names[id] === undefined ? String(id)
      : names[id] + (space || "\u00a0") + "(#" + id + ")";

    const tb = $("coalitions").tBodies[0];
    tb.textContent = "";
    s.coalitions.forEach((c) => {
      const tr = document.createElement("tr");
      tr.dataset.coalition = c.coalition;
      tr.dataset.state = c.state;
      cell(tr, c.coalition).style.color = color(c.coalition);
      cell(tr, c.edge);
      cell(tr, c.members.map((id) => who(id)).join(", "), "members");
      cell(tr, c.state, "state state-" + c.state);
      cell(tr, c.edge_round === null ? "-" : (Math.min(c.edge_round + 1, c.tau_e) + " / " + c.tau_e), "num");
      cell(tr, c.waiting.map((id) => who(id)).join(", "), "waiting");
      cell(tr, secs(c.elapsed_s), "num");
      const eta = cell(tr, secs(c.eta_s), "num");
      if (c.elapsed_s !== null && c.t_hat_s !== null && c.elapsed_s > c.t_hat_s) eta.className += " late";
      cell(tr, secs(c.t_hat_s), "num");
      cell(tr, fmt(c.delta, 3), "num");
      cell(tr, fmt(c.queue, 3), "num");
      cell(tr, fmt(c.share, 3), "num");
      tb.appendChild(tr);
    });

    const M = s.coalitions.length;
    const qs = [], lat = [], latLegend = [];
    for (let m = 0; m < M; m++) {
      qs.push({color: color(m), label: "Λ" + m, points: rows.map((r) => [r.round, r.queues[m]])});
      const mine = rows.filter((r) => r.coalition === m);
      // one measurement per answered task (dot); the estimate it was dispatched with (bar)
      lat.push({color: color(m), marker: "dot", points: mine.map((r) => [r.round, r.latency_s])});
      lat.push({color: color(m), marker: "tick", dash: true, points: mine.map((r) => [r.round, r.estimate_s])});
      latLegend.push({color: color(m), marker: "line", label: "c" + m});
    }
    latLegend.push({color: "#6b7280", marker: "dot", label: "measured"},
                   {color: "#6b7280", marker: "tick", label: "T̂ at dispatch"});
    chart($("queues"), qs, "global round", 0, undefined, {xint: true});
    chart($("latency"), lat, "global round of the answer", 0, undefined, {xint: true, legend: latLegend});
    bars($("shares"), s.coalitions.map((c) => ({label: "c" + c.coalition, a: c.share, b: c.delta, color: color(c.coalition)})));
    const acc = rows.filter((r) => r.accuracy !== null).map((r) => [r.time_s, r.accuracy]);
    if (s.initial_accuracy !== null && acc.length) acc.unshift([0, s.initial_accuracy]);
    chart($("acc"), [{color: "#4f46e5", points: acc,
                      label: s.evaluation === "federated" ? "federated accuracy" : "test accuracy"}],
          (s.clock === "simulated" ? "simulated " : "") + "seconds since round 0", 0,
          (y) => (100 * y).toFixed(0) + " %");

    const ct = $("clients-table").tBodies[0];
    ct.textContent = "";
    const top = Math.max(0.1, ...s.clients.map((c) => Math.max(c.directive_ghz || 0, c.applied_ghz || 0)));
    s.clients.forEach((c) => {
      const tr = document.createElement("tr");
      tr.dataset.client = c.client;
      cell(tr, who(c.client, " "), "client");  // may wrap before the id (style.css)
      cell(tr, c.coalition === null ? "-" : c.coalition);
      cell(tr, c.device || "-");
      cell(tr, fmt(c.directive_ghz, 2), "num");
      cell(tr, fmt(c.applied_ghz, 2), "num");
      // the bars take whatever width the cell has left (a share of it, never a fixed size)
      const td = cell(tr, "", "bars");
      const a = document.createElement("span"); a.className = "bar";
      a.style.width = (100 * (c.directive_ghz || 0) / top).toFixed(1) + "%";
      const b = document.createElement("span"); b.className = "bar applied";
      b.style.width = (100 * (c.applied_ghz || 0) / top).toFixed(1) + "%";
      td.appendChild(a); td.appendChild(b);
      ct.appendChild(tr);
    });

    const at = $("class-accuracy").tBodies[0];
    at.textContent = "";
    Object.entries(s.class_accuracy || {}).forEach(([name, v]) => {
      const tr = document.createElement("tr");
      tr.dataset.cls = name;
      cell(tr, name);
      cell(tr, v === null ? "-" : (100 * v).toFixed(1) + " %", "num");
      const a = document.createElement("span"); a.className = "bar";
      a.style.width = (100 * (v || 0)).toFixed(1) + "%";
      cell(tr, "", "bars").appendChild(a);
      at.appendChild(tr);
    });

    const kt = $("counts").tBodies[0];
    kt.textContent = "";
    const k = s.counts;
    const items = [["aggregated updates", k.accepted], ["late answers (after their deadline)", k.late],
                   ["clients dropped from an edge round", k.dropped], ["tasks expired unanswered", k.expired]];
    Object.keys(k.refused).sort().forEach((r) => items.push(["refused: " + r, k.refused[r]]));
    items.forEach((it) => { const tr = document.createElement("tr"); cell(tr, it[0]); cell(tr, it[1], "num"); kt.appendChild(tr); });
  }

  function update(s) {
    const fields = s.round_fields;
    const fresh = s.history.map((a) => { const o = {}; fields.forEach((f, i) => { o[f] = a[i]; }); return o; });
    rows = rows.slice(0, s.history_from).concat(fresh);
    render(s);
  }

  function connect() {
    const es = new EventSource("events" + suffix);
    es.onopen = () => { $("link").textContent = "live"; $("link").className = "dim"; };
    es.onmessage = (e) => update(JSON.parse(e.data));
    es.onerror = () => { $("link").textContent = "disconnected, retrying…"; $("link").className = "down"; };
  }
  connect();
})();
