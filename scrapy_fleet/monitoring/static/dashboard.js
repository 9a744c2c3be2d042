// scrapy-fleet dashboard: polls /api/snapshot and /api/series, draws SVG line charts and
// tables.  No library, nothing fetched from elsewhere; every text goes in through
// textContent (worker ids, hosts and alert texts come from Redis and are never HTML).
"use strict";
(function () {
  const body = document.body;
  const REFRESH_MS = Math.max(500, parseInt(body.dataset.refreshMs, 10) || 2000);
  const TIERS = (body.dataset.tiers || "10s").split(",").filter(Boolean);
  const DEPTH = [["depth_due", "due", "#1f6feb"], ["depth_deferred", "deferred", "#8250df"],
                 ["depth_leased", "leased", "#1a7f37"], ["depth_parked", "parked", "#9a6700"],
                 ["depth_dead", "dead", "#b3261e"]];
  const PAGES = [["pages_per_min", "pages/min", "#1f6feb"], ["items_per_min", "items/min", "#1a7f37"]];
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  let tier = TIERS[0] || "10s";
  let timer = null;
  let lastSnap = null;  // the snapshot drawn last: the legends show its figures

  const tierSelect = $("tier");
  for (const t of TIERS) {
    const o = document.createElement("option");
    o.value = t; o.textContent = t;
    tierSelect.appendChild(o);
  }
  tierSelect.addEventListener("change", () => { tier = tierSelect.value; refresh(); });

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "–";
    if (typeof v !== "number") return String(v);
    if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
    return Number.isInteger(v) ? String(v) : v.toFixed(digits === undefined ? 1 : digits);
  }
  // adaptive politeness: the rate the fleet allows the host now over its ceiling (req/s)
  function rateOf(h) {
    if (h.ceiling === null || h.ceiling === undefined || h.adaptive_rate === null ||
        h.adaptive_rate === undefined) return "–";
    return h.adaptive_rate + "/" + h.ceiling;
  }
  // recrawl: a host's learned change rate (changes a day) and price (s; "max": priced out)
  function changeRate(h) {
    return h.recrawl_rate === null || h.recrawl_rate === undefined ? "–"
      : String(Number(h.recrawl_rate.toPrecision(3)));
  }
  function price(h) {
    if (h.recrawl_priced_out) return "max";
    return h.recrawl_price === null || h.recrawl_price === undefined ? "–"
      : Number(h.recrawl_price.toPrecision(4)) + "s";
  }
  function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %"; }
  function clock(t) {
    if (!t) return "–";
    return new Date(t * 1000).toLocaleTimeString([], {hour12: false});
  }
  function ago(t, now) {
    if (!t) return "–";
    const s = Math.max(0, now - t);
    return s < 90 ? s.toFixed(0) + " s ago" : (s / 60).toFixed(0) + " min ago";
  }
  function duration(s) {
    if (s === null || s === undefined) return "–";
    if (s < 120) return s.toFixed(0) + " s";
    if (s < 7200) return (s / 60).toFixed(0) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  // A line chart of several series [[t, v|null], ...] into an <svg viewBox="0 0 W H">.
  // span: [t0, t1] shared by the charts (from the first point with data to the last step).
  function lineChart(svg, series, legend, span) {
    const W = 640, H = 220, L = 48, R = 8, T = 8, B = 22;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    let [t0, t1] = span, vmax = 0, total = 0;
    for (const s of series) for (const [, v] of s.points) {
      if (v === null) continue;
      vmax = Math.max(vmax, v); total++;
    }
    svg.dataset.points = String(total);
    legend.textContent = "";
    for (const s of series) {
      const item = el("span", {"data-series": s.name});
      const swatch = el("i"); swatch.style.background = s.color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s.label + " " + fmt(s.now)));
      legend.appendChild(item);
    }
    if (!total) {
      svg.appendChild(sv("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"},
                         "no data yet"));
      return;
    }
    if (!(t1 > t0)) { t0 -= 5; t1 += 5; }
    const nice = niceMax(vmax);
    const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
    const y = (v) => T + (H - T - B) * (1 - v / nice);
    for (let i = 0; i <= 4; i++) {
      const v = nice * i / 4;
      svg.appendChild(sv("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid"}));
      svg.appendChild(sv("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "axis"},
                         fmt(v, Number.isInteger(v) ? 0 : v < 10 ? 2 : 1)));
    }
    for (let i = 0; i <= 3; i++) {
      const t = t0 + (t1 - t0) * i / 3;
      svg.appendChild(sv("text", {x: x(t), y: H - 6, class: "axis",
                                  "text-anchor": i === 0 ? "start" : i === 3 ? "end" : "middle"},
                         clock(t)));
    }
    for (const s of series) {
      let d = "", pen = false, n = 0;
      for (const [t, v] of s.points) {
        if (v === null) { pen = false; continue; }
        d += (pen ? "L" : "M") + x(t).toFixed(1) + "," + y(v).toFixed(1);
        pen = true; n++;
      }
      if (!n) continue;
      const path = sv("path", {d: d, class: "line", stroke: s.color, "data-series": s.name,
                               "data-points": n});
      svg.appendChild(path);
      if (n <= 90) {  // few points: mark each one
        for (const [t, v] of s.points) {
          if (v === null) continue;
          svg.appendChild(sv("circle", {cx: x(t), cy: y(v), r: 2.5, fill: s.color,
                                        class: "point", "data-series": s.name}));
        }
      }
    }
  }
  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 6, 8, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // "last 60 s", or the crawl's age while it is younger: what the rates are taken over
  function rateWindow(r) {
    const w = r && r.window_s;
    if (w === null || w === undefined) return "";
    return " (last " + (w >= 59.5 ? 60 : Math.round(w)) + " s)";
  }
  // the figure the cards show for each series: one definition for a card and its legend
  function nowValues(snap) {
    if (!snap) return {};
    const f = snap.frontier || {}, r = snap.rates || {};
    return {depth_due: f.due, depth_deferred: f.deferred, depth_leased: f.leased,
            depth_parked: f.parked, depth_dead: f.dead, pages_per_min: r.pages_per_min,
            items_per_min: r.items_per_min};
  }

  function figures(snap) {
    const f = snap.frontier || {}, c = snap.counters || {}, r = snap.rates || {};
    const win = rateWindow(r);
    const rows = [["due", fmt(f.due)], ["deferred", fmt(f.deferred)],
                  ["leased (held by workers)", fmt(f.leased)],
                  ["parked", fmt(f.parked)], ["dead letters", fmt(f.dead)],
                  ["runnable now", fmt(snap.runnable_now)], ["pages", fmt(c.pages)],
                  ["items (reported)", fmt(c.items_scraped)], ["pages/min", fmt(r.pages_per_min)],
                  ["items/min", fmt(r.items_per_min)], ["block rate", pct(r.block_rate)],
                  ["ETA", duration(snap.eta_seconds)], ["workers alive", fmt(snap.workers_alive)]];
    // what was not done: failed requests (scrapy fleet failed), items a pipeline could not write
    rows.push(["failed requests", fmt(f.failed)], ["items failed", fmt(c.items_failed)]);
    // the recrawl (docs/recrawl.md), for a crawl that has one
    const rv = snap.recrawl || {};
    if (rv.tracked || rv.scheduled) {
      rows.push(["recrawl tracked", fmt(rv.tracked)], ["revisits due now", fmt(rv.due)],
                ["revisits overdue", fmt(rv.overdue)],
                ["revisits per minute", fmt(rv.revisits_per_min)],
                ["revisits changed", pct(rv.changed_share)],
                ["revisits unchanged 200", pct(rv.unchanged_share)],
                ["revisits 304", pct(rv.not_modified_share)]);
    }
    // session pools (docs/sessions.md), for a crawl that has some
    const pools = Object.values(snap.sessions || {});
    if (pools.length) {
      const sum = (f) => pools.reduce((n, p) => n + (f(p) || 0), 0);
      const retired = (p) => Object.values(p.retired || {}).reduce((n, v) => n + v, 0);
      rows.push(["sessions active", fmt(sum((p) => p.active)) + " / " + fmt(sum((p) => p.drawable))],
                ["session logins", fmt(sum((p) => p.logins))],
                ["sessions retired", fmt(sum(retired))],
                ["session check failures", fmt(sum((p) => p.check_failed))]);
    }
    const box = $("figures");
    box.textContent = "";
    for (const [k, v] of rows) {
      const d = el("div", {class: "figure", "data-key": k});
      d.appendChild(el("div", {class: "v"}, v));
      d.appendChild(el("div", {class: "k"}, k.endsWith("/min") ? k + win : k));
      box.appendChild(d);
    }
  }
  function alerts(snap) {
    const ul = $("alerts");
    ul.textContent = "";
    const list = snap.alerts || [];
    if (!list.length) { ul.appendChild(el("li", {class: "none"}, "none")); return; }
    for (const a of list) {
      const li = el("li", {class: a.severity || "warning", "data-alert": a.id || ""});
      li.appendChild(el("strong", {}, (a.severity || "warning") + ": "));
      li.appendChild(document.createTextNode((a.what || a.id || "") +
        (a.where ? " (" + a.where + ")" : "") + (a.since ? ", since " + clock(a.since) : "")));
      if (a.next) {
        li.appendChild(document.createTextNode(" → "));
        li.appendChild(el("code", {}, a.next));
      }
      ul.appendChild(li);
    }
  }
  function table(id, rows, cells) {
    const tbody = $(id).querySelector("tbody");
    tbody.textContent = "";
    for (const row of rows) {
      const tr = el("tr");
      for (const [text, cls] of cells(row)) tr.appendChild(el("td", cls ? {class: cls} : {}, text));
      tbody.appendChild(tr);
    }
    if (!rows.length) {  // a placeholder row, outside tbody's data rows
      const tr = el("tr", {class: "none"});
      tr.appendChild(el("td", {colspan: $(id).querySelectorAll("th").length}, "none"));
      tbody.appendChild(tr);
    }
  }
  function render(snap) {
    const now = snap.at || Date.now() / 1000;
    figures(snap);
    alerts(snap);
    const workers = snap.workers || [];
    $("workers-count").textContent = "(" + (snap.workers_alive || 0) + " alive of " +
      workers.length + ")";
    table("workers", workers, (w) => [
      [w.id, "mono"], [w.state], [w.health, "health-" + w.health], [fmt(w.leases), "n"],
      [fmt(w.downloads), "n"], [fmt(w.pages), "n"], [fmt(w.items), "n"], [fmt(w.errors), "n"],
      [ago(w.last_seen, now)], ["Scrapy " + (w.scrapy_version || "?") + ", fleet " +
                                (w.fleet_version || "?")]]);
    table("hosts", snap.hosts || [], (h) => [
      [h.host, "mono"], [fmt(h.queued), "n"], [fmt(h.leased), "n"], [fmt(h.pages), "n"],
      [fmt(h.bans), "n"], [pct(h.block_rate), "n"], [h.hold_until ? clock(h.hold_until) : "–"],
      [rateOf(h), "n"], [h.capacity === null || h.capacity === undefined ? "–" : String(h.capacity), "n"],
      [h.last_decrease ? h.last_decrease + " " + clock(h.last_decrease_at) : "–"],
      [fmt(h.recrawl_pages), "n"], [changeRate(h), "n"], [price(h), "n"]]);
    $("updated").textContent = "updated " + clock(now);
  }
  // the legend shows the snapshot's figure (the card's), else the last point drawn
  function chartSeries(defs, data, values) {
    const win = lastSnap ? rateWindow(lastSnap.rates) : "";
    return defs.map(([name, label, color]) => {
      const points = (data.series || {})[name] || [];
      let last = null;
      for (const p of points) if (p[1] !== null) last = p[1];
      const known = values[name] !== undefined && values[name] !== null;
      return {name, label: label.endsWith("/min") && known ? label + win : label, color,
              points, now: known ? values[name] : last};
    });
  }
  function timeSpan(data) {
    let t0 = Infinity, t1 = -Infinity;
    for (const points of Object.values(data.series || {})) {
      for (const [t, v] of points) {
        t1 = Math.max(t1, t);
        if (v !== null) t0 = Math.min(t0, t);
      }
    }
    return [t0 === Infinity ? t1 : t0, t1];
  }
  function setError(message) {
    const banner = $("error");
    const up = $("up");
    if (message) {
      banner.hidden = false;
      banner.textContent = message;
      up.textContent = "Redis down"; up.className = "badge down";
    } else {
      banner.hidden = true;
      up.textContent = "live"; up.className = "badge up";
    }
  }
  async function getJSON(url) {
    const resp = await fetch(url, {cache: "no-store"});
    let payload = null;
    try { payload = await resp.json(); } catch (e) { payload = null; }
    return {ok: resp.ok, status: resp.status, payload};
  }
  async function refresh() {
    clearTimeout(timer);
    try {
      const names = DEPTH.concat(PAGES).map((d) => d[0]).join(",");
      const [snap, series] = await Promise.all([
        getJSON("/api/snapshot"),
        getJSON("/api/series?name=" + names + "&tier=" + encodeURIComponent(tier))]);
      if (snap.ok) {
        lastSnap = snap.payload;
        render(snap.payload);
      } else if (snap.payload && snap.payload.last_snapshot) {
        lastSnap = snap.payload.last_snapshot;
        render(snap.payload.last_snapshot);
      }
      if (series.ok) {
        const span = timeSpan(series.payload);
        const values = nowValues(lastSnap);
        lineChart($("chart-depth"), chartSeries(DEPTH, series.payload, values),
                  $("legend-depth"), span);
        lineChart($("chart-pages"), chartSeries(PAGES, series.payload, values),
                  $("legend-pages"), span);
      }
      const failed = !snap.ok ? snap : !series.ok ? series : null;
      if (failed) {
        const p = failed.payload || {};
        setError((p.error || "HTTP " + failed.status) +
                 (p.error_since ? " (since " + clock(p.error_since) + ")" : "") +
                 (p.last_snapshot ? ": showing the last data read" : ""));
      } else {
        setError(null);
      }
    } catch (e) {
      setError("cannot reach the monitor: " + e);
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
})();
