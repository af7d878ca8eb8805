// seamguard dashboard: a renderer of the API's snapshot. No framework, no build step,
// no library: charts are hand-rolled SVG, the fleet map is canvas.
// Polls /api/v1/summary; when the controller's tick moves, redraws the map, the fleet
// and cooling-loop panels, fabric, timeline, throughput, jobs and the selected entity.
// What is shown (time range or zoom, selected entity, drilled loop, filters) lives in the
// URL's hash, so a pasted link or a reload reopens the same view. History comes from the
// API's since/until reads: the ledger's record and state counts, the controller's series.
// Large fleets are drawn as labelled per-loop tiles and drilled into on click (never one
// DOM node per GPU).
"use strict";

const API = "/api/v1";
const STATES = ["healthy", "degraded", "checkpoint_unsafe", "quarantine", "harmful", "failed"];
const css = getComputedStyle(document.documentElement);
const cssv = n => css.getPropertyValue(n).trim();
const COLOR = Object.fromEntries(STATES.map(s => [s, cssv("--" + s)]));
const CODE_COLOR = STATES.map(s => COLOR[s]);
const LINE = cssv("--line-value") || "#f2f4f7", PEER = cssv("--line-peer") || "#8995a3";
const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 8000;
// One line each, shown wherever the scores appear (src/seamguard/assess/).
const GLOSS = {
  GFS: "gray-failure score, 0–1: the entity's evidence channels (peer deviation, error-counter trends, headroom, hard events) combined by noisy-OR",
  PRS: "propagation risk score, 0–1: how many GPUs' work waits on the entity, 1 − e^(−GPUs/256); high PRS turns a quarantine-level entity harmful",
  FAE: "failure amplification estimate, in healthy GPU-hours per hour at risk while the entity stays in the critical path (the slowdown it imposes plus the expected loss of a hard failure)",
};

const st = {
  tick: null, summary: null, map: null, loop: null, selected: null, busy: false, events: [],
  rects: [], nodeRects: [], tiles: [], fabricRects: { nic: [], link: [] }, lastError: "", live: false,
};

const $ = id => document.getElementById(id);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const label = s => String(s).replace(/_/g, " ");
const pad2 = n => String(Math.floor(n)).padStart(2, "0");
const pct = x => (x == null ? "—" : (100 * x).toFixed(1) + "%");
const num = (x, d = 3) => (x == null ? "—" : Math.abs(x) >= 1000 ? x.toFixed(0) : Number(x).toPrecision(d));
const swatch = s => `<i class="sw ${s}" style="background-color:${COLOR[s]}"></i>`;
const stateBadge = s => `<span class="state ${s}" style="background-color:${COLOR[s]}">${s === "failed" ? "✕ " : s === "harmful" ? "● " : ""}${esc(label(s))}</span>`;

// Time: the twin's clock is simulated seconds since start; a live source's is the wall clock.
const isClock = t => t > 1e8;
function fmtT(t) {
  if (isClock(t)) { const d = new Date(t * 1000); return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`; }
  const s = Math.max(0, Math.round(t));
  return s >= 3600 ? `${Math.floor(s / 3600)}:${pad2((s % 3600) / 60)}:${pad2(s % 60)}` : `${Math.floor(s / 60)}:${pad2(s % 60)}`;
}
const timeTitle = t => isClock(t) ? "time (local clock)" : (t >= 3600 ? "simulated time since start (h:mm:ss)" : "simulated time since start (min:s)");

// Units as people read them.
function fmtVal(v, unit) {
  if (v == null) return "—";
  switch (unit) {
    case "fraction": return (100 * v).toFixed(1) + " %";
    case "celsius": return num(v, 3) + " °C";
    case "per_hour": return num(v, 3) + " /h";
    case "bool": return v ? "yes" : "no";
    case "xid": return v ? "XID " + Math.round(v) : "none";
    case "percent": return num(v, 3) + " %";
    case "microseconds": return num(v, 3) + " µs";
    case "milliseconds": return num(v, 3) + " ms";
    case "seconds": return num(v, 3) + " s";
    case "litres/min": return num(v, 4) + " L/min";
    case "watts": return num(v, 3) + " W";
    case "z": return "z " + num(v, 3);
    case "score": case "gfs": return Number(v).toFixed(2);
    default: return num(v, 4) + (unit ? " " + unit : "");
  }
}
const unitLabel = u => ({ celsius: "°C", "litres/min": "L/min", microseconds: "µs", milliseconds: "ms", seconds: "s", watts: "W", percent: "%", score: "score 0–1" }[u] || u);

async function api(path, opts = {}) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  try {
    const r = await fetch(path, { ...opts, signal: ctl.signal });
    const body = r.headers.get("content-type")?.includes("json") ? await r.json() : await r.text();
    if (!r.ok) throw new Error(typeof body === "object" ? (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)) : body);
    return body;
  } finally { clearTimeout(timer); }
}

function authed(method, path, body) {
  const token = $("token").value.trim();
  if (!token) { banner("Enter the operator token (printed by `seamguard serve`) to change the controller."); return Promise.reject(new Error("no token")); }
  return api(path, { method, headers: { "Authorization": "Bearer " + token, "Content-Type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
}

function banner(msg) { const b = $("banner"); b.textContent = msg; b.classList.toggle("hidden", !msg); }

// ---- the view: time range, zoom, entity and filters, kept in the URL -------------------------
const RANGES = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
const DEFAULT_RANGE = "1h";
const MIN_ZOOM_S = 10;  // the narrowest window a zoom opens (a few ticks)
const view = { range: DEFAULT_RANGE, since: null, until: null };  // since/until: a zoom (absolute)

// From the hash: #range=6h&entity=gpu:gpu000/gpu3&loop=loop-002&actions=1&worst=1, or
// since=..&until=.. (controller seconds) after a zoom. Anything malformed is ignored.
function readURL() {
  const q = new URLSearchParams(location.hash.replace(/^#/, ""));
  const fin = x => x != null && x !== "" && Number.isFinite(+x) ? +x : null;
  view.range = RANGES[q.get("range")] ? q.get("range") : DEFAULT_RANGE;
  const a = fin(q.get("since")), b = fin(q.get("until"));
  [view.since, view.until] = a != null && b != null && a < b ? [a, b] : [null, null];
  const ent = q.get("entity") || "", k = ent.indexOf(":");
  st.selected = k > 0 ? { kind: ent.slice(0, k), name: ent.slice(k + 1) } : null;
  st.loop = q.get("loop") || null;
  $("actionsonly").checked = q.get("actions") === "1";
  $("worstfirst").checked = q.get("worst") === "1";
  $("range").value = view.since == null ? view.range : "zoom";
}

function viewHash() {
  const q = new URLSearchParams();
  if (view.since != null) { q.set("since", String(+view.since.toFixed(3))); q.set("until", String(+view.until.toFixed(3))); }
  else q.set("range", view.range);
  if (st.selected) q.set("entity", `${st.selected.kind}:${st.selected.name}`);
  if (st.loop) q.set("loop", st.loop);
  if ($("actionsonly").checked) q.set("actions", "1");
  if ($("worstfirst").checked) q.set("worst", "1");
  return "#" + q.toString();
}

function writeURL() {
  const h = viewHash();
  if (h !== location.hash) history.replaceState(null, "", h);
}

const nowT = () => (st.summary ? st.summary.t_s : 0);
// The window asked for: [since, until]; until = null follows the controller's clock.
function span() {
  if (view.since != null) return { since: view.since, until: view.until };
  return { since: Math.max(0, nowT() - RANGES[view.range]), until: null };
}
const rangeQS = () => { const w = span(); return `since=${w.since}` + (w.until != null ? `&until=${w.until}` : ""); };
// What the charts draw: the window, starting no earlier than the ledger's first tick.
function chartWindow() {
  const w = span(), end = w.until != null ? Math.min(w.until, Math.max(nowT(), w.since + 1)) : nowT();
  const t0 = st.historyStart != null ? Math.max(w.since, Math.min(st.historyStart, end - 1)) : w.since;
  return [t0, Math.max(end, t0 + 1)];
}

function renderRange() {
  const [t0, t1] = chartWindow();
  $("range").value = view.since == null ? view.range : "zoom";
  $("zoomopt").hidden = view.since == null;
  $("zoomreset").disabled = view.since == null;
  $("rangetext").textContent = `${fmtT(t0)} – ${view.since == null ? "now" : fmtT(t1)}`;
  $("rangetext").title = `controller time ${t0.toFixed(1)} – ${t1.toFixed(1)} s; drag across any chart to zoom; the URL holds this view`;
}

function setView(change) {
  Object.assign(view, change);
  writeURL(); renderRange();
  st.dirty = true; poll();
}

function zoomTo(a, b) {
  const mid = (a + b) / 2, half = Math.max(b - a, MIN_ZOOM_S) / 2;
  setView({ since: Math.max(0, mid - half), until: mid + half });
}
function zoomBy(factor) {
  const [t0, t1] = chartWindow(), mid = (t0 + t1) / 2, half = (t1 - t0) * factor / 2;
  const until = Math.min(mid + half, nowT());
  zoomTo(Math.max(0, until - 2 * half), until);
}

// Drag across any time-series chart (svg.chart) to zoom to the times under the drag.
function bindZoom() {
  let drag = null;
  const box = document.createElement("div"); box.className = "zoomsel hidden"; document.body.appendChild(box);
  document.addEventListener("mousedown", ev => {
    const svg = ev.target.closest && ev.target.closest("svg.chart");
    if (!svg || ev.button !== 0) return;
    const r = svg.getBoundingClientRect(), scale = r.width / (+svg.getAttribute("width") || r.width);
    const d = svg.dataset, x0 = r.left + d.x0 * scale, x1 = r.left + d.x1 * scale;
    if (ev.clientX < x0 || ev.clientX > x1) return;
    drag = { t0: +d.t0, t1: +d.t1, x0, x1, top: r.top, h: r.height, from: ev.clientX };
    ev.preventDefault();
  });
  document.addEventListener("mousemove", ev => {
    if (!drag) return;
    const a = Math.max(drag.x0, Math.min(drag.from, ev.clientX)), b = Math.min(drag.x1, Math.max(drag.from, ev.clientX));
    Object.assign(box.style, { left: a + "px", width: (b - a) + "px", top: drag.top + "px", height: drag.h + "px" });
    box.classList.remove("hidden");
  });
  document.addEventListener("mouseup", ev => {
    if (!drag) return;
    const g = drag; drag = null; box.classList.add("hidden");
    const clamp = x => Math.max(g.x0, Math.min(g.x1, x));
    const a = clamp(Math.min(g.from, ev.clientX)), b = clamp(Math.max(g.from, ev.clientX));
    if (b - a < 4) return;  // a click, not a drag
    const t = x => g.t0 + (g.t1 - g.t0) * (x - g.x0) / (g.x1 - g.x0);
    zoomTo(t(a), t(b));
  });
}

// ---- charts (SVG) ------------------------------------------------------------------------------
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
function niceStep(span, target) {
  const raw = span / Math.max(target, 1), p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}
function yFmt(v, step) { const d = step >= 1 ? 0 : Math.min(4, Math.ceil(-Math.log10(step))); return Math.abs(v) >= 10000 ? (v / 1000).toFixed(0) + "k" : v.toFixed(d); }

// One time-series panel: real time axis with title, y ticks with unit, optional peer band,
// thresholds, stacked areas, state strip and state-change annotations (Grafana's time
// series + state timeline conventions). Returns SVG markup.
function tsChart(o) {
  const W = Math.max(220, Math.floor(o.width || 400)), H = o.height || 140;
  const strip = o.strip ? 7 : 0;
  const L = 46, R = 10, T = 20, B = 30 + strip;
  const pw = W - L - R, ph = H - T - B;
  const t0 = o.t0, t1 = Math.max(o.t1, o.t0 + 1);
  let lo = o.yMin, hi = o.yMax;
  if (lo == null || hi == null) {
    const vals = [];
    for (const s of o.series || []) for (const v of s.v) if (v != null) vals.push(v);
    for (const b of o.bands || []) { for (const v of b.lo) if (v != null) vals.push(v); for (const v of b.hi) if (v != null) vals.push(v); }
    for (const th of o.thresholds || []) vals.push(th.v);
    if (o.stack) { for (let i = 0; i < o.stack.t.length; i++) vals.push(o.stack.layers.reduce((a, l) => a + (l.v[i] || 0), 0)); vals.push(0); }
    let a = vals.length ? Math.min(...vals) : 0, b = vals.length ? Math.max(...vals) : 1;
    const nonneg = a >= 0;
    if (b - a < 1e-9) { const d = Math.abs(a) * 0.05 || 1; a -= d; b += d; }
    const padv = (b - a) * 0.08;
    if (lo == null) lo = o.stack || (nonneg && a - padv < 0) ? 0 : a - padv;  // never below 0 for data that is not
    if (hi == null) hi = b + padv;
  }
  const ystep = niceStep(hi - lo, Math.max(2, Math.floor(ph / 28)));
  if (o.yMin == null && !o.stack && lo !== 0) lo = Math.floor(lo / ystep) * ystep;
  if (o.yMax == null) hi = Math.ceil(hi / ystep) * ystep;
  if (o.integer && ystep < 1) { hi = Math.max(hi, lo + 1); }
  const X = t => L + pw * (t - t0) / (t1 - t0), Y = v => T + ph * (1 - (v - lo) / (hi - lo));
  let g = "";
  // y grid and ticks
  const step = o.integer ? Math.max(1, Math.round(ystep)) : ystep;
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) {
    const y = Y(v).toFixed(1);
    g += `<line class="grid" x1="${L}" x2="${L + pw}" y1="${y}" y2="${y}"/><text x="${L - 4}" y="${+y + 3}" text-anchor="end">${o.yTick ? o.yTick(v) : yFmt(v, step)}</text>`;
  }
  g += `<text x="4" y="${T - 8}">${esc(o.unit || "")}</text>`;
  // x ticks: a nice step for the span, labelled in the source's clock
  const tstep = TIME_STEPS.find(s => s >= (t1 - t0) / Math.max(2, Math.floor(pw / 70))) || 86400;
  for (let t = Math.ceil(t0 / tstep) * tstep; t <= t1 + 1e-9; t += tstep) {
    const x = X(t).toFixed(1);
    g += `<line class="axis" x1="${x}" x2="${x}" y1="${T + ph}" y2="${T + ph + 3}"/><text x="${x}" y="${T + ph + strip + 13}" text-anchor="middle">${fmtT(t)}</text>`;
  }
  g += `<line class="axis" x1="${L}" x2="${L + pw}" y1="${T + ph}" y2="${T + ph}"/><line class="axis" x1="${L}" x2="${L}" y1="${T}" y2="${T + ph}"/>`;
  g += `<text x="${L + pw}" y="${H - 2}" text-anchor="end">${esc(o.xTitle || timeTitle(t1))}</text>`;
  const path = (t, v) => { let d = "", pen = false; for (let i = 0; i < t.length; i++) { if (v[i] == null || t[i] < t0) { pen = false; continue; } d += (pen ? "L" : "M") + X(t[i]).toFixed(1) + " " + Y(v[i]).toFixed(1); pen = true; } return d; };
  for (const b of o.bands || []) {
    // Draw each contiguous run of the band as a polygon.
    let up = [], dn = [];
    const flush = () => { if (up.length > 1) g += `<path class="band" d="M${up.join("L")}L${dn.reverse().join("L")}Z" fill="${b.color || PEER}" fill-opacity="${b.opacity || 0.22}"><title>${esc(b.label || "")}</title></path>`; up = []; dn = []; };
    for (let i = 0; i < b.t.length; i++) {
      if (b.lo[i] == null || b.hi[i] == null) { flush(); continue; }
      up.push(`${X(b.t[i]).toFixed(1)} ${Y(b.hi[i]).toFixed(1)}`); dn.push(`${X(b.t[i]).toFixed(1)} ${Y(b.lo[i]).toFixed(1)}`);
    }
    flush();
  }
  if (o.stack) {
    const base = o.stack.t.map(() => 0);
    for (const l of o.stack.layers) {
      const top = base.map((b0, i) => b0 + (l.v[i] || 0));
      if (top.some((v, i) => v !== base[i])) {
        // Counts hold from one tick to the next: steps, not slopes.
        const step = ys => o.stack.t.flatMap((t, i) => i ? [`${X(t).toFixed(1)} ${Y(ys[i - 1]).toFixed(1)}`, `${X(t).toFixed(1)} ${Y(ys[i]).toFixed(1)}`] : [`${X(t).toFixed(1)} ${Y(ys[i]).toFixed(1)}`]);
        const pts = step(top), back = step(base).reverse();
        g += `<path class="layer" data-state="${l.state}" d="M${pts.join("L")}L${back.join("L")}Z" fill="${l.color}" fill-opacity=".85"${l.state === "failed" ? ` stroke="#111" stroke-width=".6"` : ""}><title>${esc(label(l.state))}</title></path>`;
      }
      for (let i = 0; i < base.length; i++) base[i] = top[i];
    }
  }
  for (const th of o.thresholds || []) {
    if (th.v < lo || th.v > hi) continue;
    const y = Y(th.v).toFixed(1);
    g += `<g class="threshold"><line class="thr" x1="${L}" x2="${L + pw}" y1="${y}" y2="${y}" stroke="${th.color}"/><text x="${L + pw - 2}" y="${+y - 2}" text-anchor="end" style="fill:${th.color}">${esc(th.label)}</text></g>`;
  }
  for (const s of o.series || []) {
    const d = path(s.t, s.v);
    const drawn = s.t.filter((t, i) => s.v[i] != null && t >= t0);
    if (d) g += `<path class="${s.cls || "line"}" data-first="${drawn[0]}" data-points="${drawn.length}" d="${d}" fill="none" stroke="${s.color}" stroke-width="${s.width || 1.6}"${s.dash ? ` stroke-dasharray="${s.dash}"` : ""}><title>${esc(s.label || "")}</title></path>`;
  }
  if (o.strip) {
    // State timeline under the plot: one coloured run per state segment.
    for (const seg of o.strip) {
      const a = Math.max(t0, seg.t0), b = Math.min(t1, seg.t1); if (b <= a) continue;
      g += `<rect class="seg" data-state="${seg.state}" x="${X(a).toFixed(1)}" y="${T + ph + 2}" width="${Math.max(1, X(b) - X(a)).toFixed(1)}" height="5" fill="${COLOR[seg.state]}"><title>${esc(label(seg.state))} ${fmtT(a)}–${fmtT(b)}</title></rect>`;
    }
  }
  let lastX = -1e9;
  for (const a of [...(o.annotations || [])].sort((p, q) => p.t - q.t)) {
    if (a.t < t0 || a.t > t1) continue;
    const x = X(a.t).toFixed(1), c = a.color || LINE;
    const text = +x - lastX > 44 ? `<text x="${+x + 2}" y="${T - 2}" style="fill:${c}">${esc(a.short || "")}</text>` : "";
    if (text) lastX = +x;
    g += `<g class="annot${a.cls ? " " + a.cls : ""}" data-t="${a.t}" data-state="${a.state || ""}" data-x="${x}"><line x1="${x}" x2="${x}" y1="${T}" y2="${T + ph}" stroke="${c}"/>${text}<title>${esc(a.label)}</title></g>`;
  }
  return `<svg class="chart" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" data-t0="${t0}" data-t1="${t1}" data-x0="${L}" data-x1="${L + pw}">${g}</svg>`;
}

// State segments of one entity from its transitions (newest first) and its state as the window opens.
function segments(history, stateAtStart, t0, t1) {
  const tr = [...history].sort((a, b) => a.t_s - b.t_s);
  const out = [];
  let cur = stateAtStart, from = t0;
  for (const x of tr) { if (x.t_s > from) out.push({ t0: from, t1: x.t_s, state: cur }); from = Math.max(from, x.t_s); cur = x.to_state; }
  out.push({ t0: from, t1, state: cur });
  return out;
}
const annotColor = s => s === "healthy" ? "#7fa393" : COLOR[s];
const transAnnots = history => history.map(h => ({ t: h.t_s, state: h.to_state, color: annotColor(h.to_state), short: label(h.to_state), cls: "transition", label: `${fmtT(h.t_s)}: ${label(h.from_state)} → ${label(h.to_state)}${h.reasons.length ? " (" + h.reasons.slice(0, 2).map(r => r.channel).join(", ") + ")" : ""}` }));
const widthOf = id => Math.max(220, ($(id) && $(id).clientWidth) || 400);

// ---- header and pace ------------------------------------------------------------------------
function renderHeader(s) {
  st.live = isClock(s.t_s);
  $("source").textContent = `${s.source} · ${s.sizes.gpu.toLocaleString()} GPUs · ${s.sizes.node.toLocaleString()} nodes · ${s.sizes.cooling_loop} loops`;
  const p = s.pace;
  const speed = p.requested_speed > 0 ? ` · speed ${p.requested_speed}x${p.achieved_speed != null ? ` (achieved ${num(p.achieved_speed, 3)}x)` : ""}` : " · manual ticks";
  $("clock").textContent = `t=${fmtT(s.t_s)} · tick ${s.tick} · ${(s.timing.tick_s * 1000).toFixed(0)} ms${speed}`;
  const g = s.states.gpu, n = s.states.node;
  $("chips").innerHTML = STATES.filter(x => x === "healthy" || g[x] || n[x]).map(x =>
    `<span class="chip" title="GPUs / nodes ${label(x)}">${swatch(x)}${label(x)} ${g[x].toLocaleString()} / ${n[x].toLocaleString()}</span>`).join("");
  const mode = $("mode"); mode.textContent = s.mode === "enforce" ? "enforcing" : "dry run"; mode.className = "badge " + s.mode;
  const br = $("breaker"); br.className = "badge " + (s.breaker.tripped ? "tripped" : "closed");
  br.textContent = s.breaker.tripped ? "breaker TRIPPED — reset" : `breaker ok · ${s.breaker.disrupted_nodes_in_window}`;
  br.title = s.breaker.tripped ? s.breaker.reason : "safety breaker: closed";
  const pb = $("pace");
  pb.textContent = p.behind ? `⚠ The ${s.source === "twin" ? "simulation" : "controller"} is falling behind: ${p.message}. Figures are correct per tick, but time runs slower than requested.` : "";
  pb.classList.toggle("hidden", !p.behind);
  const frozen = s.frozen_scopes ? `Input failed: ${s.frozen_scopes} scope${s.frozen_scopes > 1 ? "s" : ""} frozen — no new actions there until the data is back and re-warmed (see /api/v1/failsafe).` : "";
  banner(s.timing.error ? "last tick failed: " + s.timing.error : (s.breaker.tripped ? "Safety breaker tripped: " + s.breaker.reason + " — no new actions that take capacity until a person resets it." : frozen));
}

// ---- the fleet map (canvas) ------------------------------------------------------------------
function setupCanvas(cv, height) {
  const dpr = window.devicePixelRatio || 1;
  const w = cv.parentElement.clientWidth || 600;
  cv.style.height = height + "px";
  cv.width = Math.round(w * dpr); cv.height = Math.round(height * dpr);
  const ctx = cv.getContext("2d"); ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, height);
  return [ctx, w];
}

function legend() {
  $("legend").innerHTML = STATES.map(s => `<span>${swatch(s)}${label(s)}</span>`).join("") +
    `<span class="muted">· a failed node is filled and hatched whole, its GPUs too; ✕ = failed, ● = harmful</span>`;
}

// Marks that do not rely on hue: a cross for failed, a dot for harmful.
function cellMark(ctx, x, y, c, state) {
  if (c < 6) return;
  ctx.strokeStyle = "rgba(0,0,0,.75)"; ctx.fillStyle = "rgba(0,0,0,.75)"; ctx.lineWidth = Math.max(1.2, c / 7);
  if (state === "failed") { const i = Math.max(2, c * 0.22); ctx.beginPath(); ctx.moveTo(x + i, y + i); ctx.lineTo(x + c - i, y + c - i); ctx.moveTo(x + c - i, y + i); ctx.lineTo(x + i, y + c - i); ctx.stroke(); }
  else if (state === "harmful") { ctx.beginPath(); ctx.arc(x + c / 2, y + c / 2, Math.max(1.5, c / 6), 0, 2 * Math.PI); ctx.fill(); }
}
function hatch(ctx, x, y, w, h) {
  ctx.save(); ctx.beginPath(); ctx.rect(x, y, w, h); ctx.clip();
  ctx.strokeStyle = "rgba(0,0,0,.45)"; ctx.lineWidth = 1.5;
  for (let k = -h; k < w; k += 5) { ctx.beginPath(); ctx.moveTo(x + k, y + h); ctx.lineTo(x + k + h, y); ctx.stroke(); }
  ctx.restore();
}

function drawMap() {
  const m = st.map; if (!m) return;
  const cv = $("fleetmap");
  st.rects = []; st.nodeRects = []; st.tiles = [];
  $("crumbs").innerHTML = st.loop ? `<a data-loop="">all loops</a> › ${esc(st.loop)}` : (m.aggregated ? "all loops (aggregated: click a loop tile to drill down)" : "all loops");
  $("worstwrap").classList.toggle("hidden", !(m.aggregated && !st.loop));
  const fn = m.failed_nodes;
  $("failednodes").innerHTML = fn.length ? `<span class="muted">failed nodes:</span>` + fn.map(e => `<span class="st failed" data-kind="node" data-name="${esc(e.name)}" title="${esc(e.name)} failed since ${fmtT(e.since_t_s)} (${esc(e.loop)}, ${esc(e.rack)})">✕ ${esc(e.name)}</span>`).join("") : "";
  cv.dataset.failedNodes = fn.map(e => e.name).join(" ");
  if (m.aggregated && !st.loop) return drawLoopTiles(cv, m);
  return drawDetail(cv, m.detail);
}

function drawLoopTiles(cv, m) {
  const w0 = cv.parentElement.clientWidth || 600;
  const tw = 88, th = 38, gap = 5, per = Math.max(1, Math.floor((w0 + gap) / (tw + gap)));
  let loops = m.loops.map(lp => ({ ...lp, bad: STATES.slice(1).reduce((a, s) => a + lp.gpu_states[s], 0), sev: STATES.indexOf(lp.worst) }));
  if ($("worstfirst").checked) loops = [...loops].sort((a, b) => b.sev - a.sev || b.bad - a.bad || a.index - b.index);
  const rows = Math.ceil(loops.length / per);
  const [ctx] = setupCanvas(cv, rows * (th + gap) + 4);
  ctx.textBaseline = "top";
  loops.forEach((lp, i) => {
    const x = (i % per) * (tw + gap), y = Math.floor(i / per) * (th + gap) + 2;
    const total = STATES.reduce((a, s) => a + lp.gpu_states[s], 0) || 1;
    const fnodes = lp.node_states.failed || 0;
    ctx.fillStyle = "#1b222a"; ctx.fillRect(x, y, tw, th);
    // A bar of the loop's GPUs by state, worst on the right; any non-healthy state gets >= 3 px.
    const bx = x + 4, by = y + th - 11, bw = tw - 8, bh = 7;
    ctx.fillStyle = COLOR.healthy; ctx.fillRect(bx, by, bw, bh);
    let right = bx + bw;
    for (let k = STATES.length - 1; k >= 1; k--) {
      const n = lp.gpu_states[STATES[k]]; if (!n) continue;
      const wpx = Math.max(3, Math.round(bw * n / total)); right -= wpx;
      ctx.fillStyle = COLOR[STATES[k]]; ctx.fillRect(Math.max(bx, right), by, Math.min(wpx, right + wpx - bx), bh);
      if (STATES[k] === "failed") hatch(ctx, Math.max(bx, right), by, wpx, bh);
    }
    const worst = lp.worst;
    ctx.strokeStyle = worst === "healthy" ? "#2a343f" : COLOR[worst]; ctx.lineWidth = worst === "healthy" ? 1 : 2;
    ctx.strokeRect(x + 1, y + 1, tw - 2, th - 2);
    ctx.font = "600 11px system-ui, sans-serif"; ctx.fillStyle = worst === "healthy" ? "#aab4bf" : "#e8edf2";
    const lbl = lp.name.replace(/^loop-/, "L");
    ctx.fillText(lbl, x + 5, y + 5);
    ctx.font = "10px system-ui, sans-serif"; ctx.textAlign = "right";
    ctx.fillStyle = fnodes ? COLOR.failed : worst === "healthy" ? "#6f7a86" : COLOR[worst];
    ctx.fillText(fnodes ? `✕${fnodes} node${fnodes > 1 ? "s" : ""}` : lp.bad ? `${lp.bad} GPU${lp.bad > 1 ? "s" : ""}` : "ok", x + tw - 5, y + 6);
    ctx.textAlign = "left";
    st.rects.push({ x, y, w: tw, h: th, kind: "loop", name: lp.name, tip: loopTip(lp) });
    st.tiles.push({ name: lp.name, label: lbl, x, y, w: tw, h: th, worst, bad: lp.bad, failed_nodes: fnodes });
  });
  cv.setAttribute("aria-label", `fleet map: ${loops.length} cooling loop tiles`);
  const bad = m.loops.filter(l => l.worst !== "healthy").length;
  $("maphint").textContent = `${m.loops.length} cooling loops (tile L### = loop-###); ${bad} with non-healthy GPUs, nodes or facilities. Each tile: loop, count of non-healthy GPUs (or ✕ failed nodes), a bar of its GPUs by state; border = worst state. Click a tile for its racks, nodes and GPUs.`;
}

function loopTip(lp) {
  const parts = STATES.filter(s => lp.gpu_states[s]).map(s => `${label(s)} ${lp.gpu_states[s]}`);
  const nodes = STATES.slice(1).filter(s => lp.node_states[s]).map(s => `${label(s)} ${lp.node_states[s]}`);
  return `${lp.name} (worst: ${label(lp.worst)})\nGPUs: ${parts.join(", ")}${nodes.length ? "\nnodes: " + nodes.join(", ") : ""}\nclick to drill down`;
}

function drawDetail(cv, loops) {
  const w = cv.parentElement.clientWidth || 600;
  let maxGpn = 1, maxNpr = 1, maxRpl = 1;
  for (const lp of loops) { maxRpl = Math.max(maxRpl, lp.racks.length); for (const r of lp.racks) { maxNpr = Math.max(maxNpr, r.nodes.length); for (const g of r.gpu_states) maxGpn = Math.max(maxGpn, g.length); } }
  const single = loops.length === 1;
  const layout = (c, rpr) => {
    const nodeW = maxGpn * (c + 1) + 6, rackW = nodeW + 8, rackH = maxNpr * (c + 4) + 16;
    const loopW = rpr * (rackW + 6) + 10, loopH = Math.ceil(maxRpl / rpr) * (rackH + 6) + 24;
    const lpr = Math.max(1, Math.min(loops.length, Math.floor((w + 8) / (loopW + 8))));
    return { c, nodeW, rackW, rackH, rpr, loopW, loopH, lpr, height: Math.ceil(loops.length / lpr) * (loopH + 8) };
  };
  // Pick the largest cells that fit the width and keep the map about one screen tall.
  const cands = [];
  const rprs = [...new Set([maxRpl, Math.ceil(maxRpl / 2), 4, 3, 2, 1])].filter(x => x >= 1 && x <= maxRpl);
  for (let c = single ? 18 : 12; c >= 4; c--)
    for (const rpr of rprs) { const L = layout(c, rpr); if (L.loopW <= w) cands.push(L); }
  const fit = cands.filter(L => L.height <= 620);
  const L = fit.length ? fit.reduce((a, b) => (b.c > a.c || (b.c === a.c && b.height < a.height)) ? b : a)
    : (cands.length ? cands.reduce((a, b) => (b.height < a.height ? b : a)) : layout(4, 1));
  const cell = L.c;
  const rows = Math.ceil(loops.length / L.lpr);
  const [ctx] = setupCanvas(cv, rows * (L.loopH + 8) + 4);
  ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "top";
  loops.forEach((lp, li) => {
    const lx = (li % L.lpr) * (L.loopW + 8), ly = Math.floor(li / L.lpr) * (L.loopH + 8) + 2;
    ctx.fillStyle = "#1b222a"; ctx.fillRect(lx, ly, L.loopW, L.loopH);
    ctx.strokeStyle = lp.state === "healthy" ? "#2a343f" : COLOR[lp.state]; ctx.lineWidth = lp.state === "healthy" ? 1 : 2;
    ctx.strokeRect(lx + .5, ly + .5, L.loopW - 1, L.loopH - 1);
    ctx.fillStyle = lp.state === "healthy" ? "#aab4bf" : COLOR[lp.state];
    ctx.fillText(`${lp.loop}${lp.state !== "healthy" ? "  · " + label(lp.state) : ""}`, lx + 6, ly + 5);
    st.rects.push({ x: lx, y: ly, w: L.loopW, h: 18, kind: "cooling_loop", name: lp.loop, tip: `${lp.loop}: ${label(lp.state)} (click for the loop)` });
    lp.racks.forEach((r, ri) => {
      const rx = lx + 6 + (ri % L.rpr) * (L.rackW + 6), ry = ly + 22 + Math.floor(ri / L.rpr) * (L.rackH + 6);
      ctx.fillStyle = "#141a20"; ctx.fillRect(rx, ry, L.rackW, L.rackH);
      ctx.fillStyle = "#77828e"; ctx.fillText(r.name.replace("rack-", "r"), rx + 3, ry + 2);
      st.rects.push({ x: rx, y: ry, w: L.rackW, h: 13, kind: "rack", name: r.name, tip: r.name });
      r.nodes.forEach((node, ni) => {
        const codes = r.gpu_states[ni];
        const nx = rx + 4, ny = ry + 15 + ni * (cell + 4);
        const ns = STATES[+r.node_states[ni]];
        // The node's own rectangle spans all its GPUs: marked whole when it is not healthy.
        const nr = { x: nx - 2, y: ny - 2, w: codes.length * (cell + 1) + 3, h: cell + 4, name: node, state: ns };
        st.nodeRects.push(nr);
        st.rects.push({ ...nr, kind: "node", tip: `node ${node}: ${label(ns)}` });
        if (ns === "failed") { ctx.fillStyle = COLOR.failed; ctx.fillRect(nr.x, nr.y, nr.w, nr.h); hatch(ctx, nr.x, nr.y, nr.w, nr.h); }
        for (let g = 0; g < codes.length; g++) {
          const gx = nx + g * (cell + 1), gs = STATES[+codes[g]];
          const name = r.gpu_names[ni][g];
          // A failed node's healthy GPUs are not usable: they show the node's hatching, never green.
          if (!(ns === "failed" && gs === "healthy")) { ctx.fillStyle = CODE_COLOR[+codes[g]]; ctx.fillRect(gx, ny, cell, cell); cellMark(ctx, gx, ny, cell, gs); }
          else cellMark(ctx, gx, ny, cell, "failed");
          st.rects.push({ x: gx, y: ny, w: cell, h: cell, kind: "gpu", name, state: gs, tip: `${name} — ${label(gs)}\nnode ${node}: ${label(ns)}${ns === "failed" ? " (GPU unusable while its node is failed)" : ""}` });
          if (st.selected && st.selected.kind === "gpu" && st.selected.name === name) {
            ctx.strokeStyle = "#fff"; ctx.lineWidth = 2; ctx.strokeRect(gx - 1, ny - 1, cell + 2, cell + 2);
          }
        }
        if (ns !== "healthy") { ctx.strokeStyle = COLOR[ns]; ctx.lineWidth = 2; ctx.strokeRect(nr.x + 1, nr.y + 1, nr.w - 2, nr.h - 2); }
        if (st.selected && st.selected.kind === "node" && st.selected.name === node) { ctx.strokeStyle = "#fff"; ctx.lineWidth = 1.5; ctx.strokeRect(nr.x - 1, nr.y - 1, nr.w + 2, nr.h + 2); }
      });
    });
  });
  const n = loops.reduce((a, lp) => a + lp.racks.reduce((b, r) => b + r.gpu_states.reduce((c, g) => c + g.length, 0), 0), 0);
  cv.setAttribute("aria-label", `fleet map: ${n} GPUs`);
  $("maphint").textContent = `${n.toLocaleString()} GPUs drawn: cooling loop → rack → node (a framed row) → GPU (a cell). Click a GPU for its evidence and signals, a node's frame for the node, a rack or loop label for its summary.`;
}

function hit(rects, cv, ev) {
  const b = cv.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
  // Later rects are smaller (GPU cells drawn over their node, rack and loop): search from the end.
  for (let i = rects.length - 1; i >= 0; i--) { const r = rects[i]; if (x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h) return r; }
  return null;
}

function tooltip(ev, text) {
  let t = document.querySelector(".tooltip");
  if (!text) { if (t) t.remove(); return; }
  if (!t) { t = document.createElement("div"); t.className = "tooltip"; document.body.appendChild(t); }
  t.textContent = text; t.style.left = (ev.clientX + 12) + "px"; t.style.top = (ev.clientY + 12) + "px";
}

function bindCanvas(cv, getRects) {
  cv.addEventListener("mousemove", ev => { const r = hit(getRects(), cv, ev); tooltip(ev, r && r.tip); });
  cv.addEventListener("mouseleave", ev => tooltip(ev, null));
  cv.addEventListener("click", ev => {
    const r = hit(getRects(), cv, ev); if (!r) return;
    if (r.kind === "loop") { select("cooling_loop", r.name); return; }
    if (r.index != null && !r.name) {
      api(`${API}/entities?kind=${r.kind}&limit=1&offset=${r.index}`).then(p => p.items[0] && select(r.kind, p.items[0].name)).catch(showErr);
      return;
    }
    select(r.kind, r.name);
  });
}

// ---- fleet state and cooling loops over time -------------------------------------------------------
// State counts over the window, replayed by the API from the ledger (/history/states).
function renderStateHistory(states) {
  const [t0, t1] = chartWindow();
  const acts = st.events.filter(e => e.type === "action" && e.t_s >= t0 && e.t_s <= t1).slice(0, 40).map(e => ({ t: e.t_s, color: "#c9d1d9", label: `${fmtT(e.t_s)}: ${e.text}`, cls: "action" }));
  for (const sc of states) {
    const id = sc.kind === "gpu" ? "gpustates" : "nodestates";
    if (sc.t_s.length < 2) { $(id).innerHTML = `<div class="muted small">no ticks recorded in this window</div>`; continue; }
    const layers = STATES.slice(1).map(s => ({ state: s, color: COLOR[s], v: sc.counts[s] }));
    $(id).innerHTML = tsChart({
      width: widthOf(id), height: 150, t0, t1, unit: sc.kind === "gpu" ? "GPUs" : "nodes",
      integer: true, stack: { t: sc.t_s, layers }, annotations: acts,
    }) + (layers.every(l => l.v.every(v => !v)) ? `<div class="muted small">none: every ${sc.kind === "gpu" ? "GPU" : "node"} healthy in this window</div>` : "");
  }
}

// Where a series' older points came from: the ledger's persisted rows, before what memory holds.
function persistedNote(p, t) {
  if (!p || p.until_t_s == null || !t.length || t[0] >= p.until_t_s) return "";
  const res = p.resolution_s ? `rolled up per ${p.resolution_s >= 60 ? p.resolution_s / 60 + " min" : p.resolution_s + " s"}` : "per tick";
  return ` · before ${fmtT(p.until_t_s)} from the ledger (${res})`;
}

// Coolant per loop over the window: the controller's last ticks, the ledger's persisted rows before them.
function renderFleetHistory(h) {
  renderTputChart(h);
  const t = h.t_s;
  if (t.length < 2) {
    const held = h.persisted ? " (none in memory or in the ledger)" : h.held_since_t_s != null ? ` (the controller holds coolant from ${fmtT(h.held_since_t_s)} on)` : "";
    for (const id of ["loopflow", "loopsupply"]) $(id).innerHTML = `<div class="muted small">no coolant samples in this window${esc(held)}</div>`;
    return;
  }
  const [t0, t1] = chartWindow();
  // Coolant: the band of all loops (10th–90th percentile, median dashed), each listed loop a line.
  const band = (b, f = x => x) => ({ t, lo: b.p10.map(v => v == null ? null : f(v)), hi: b.p90.map(v => v == null ? null : f(v)), label: `all ${h.loops_total} loops, 10th–90th percentile` });
  const sel = st.selected && st.selected.kind === "cooling_loop" ? st.selected.name : st.loop;
  const lineColor = lp => lp.name === sel ? LINE : lp.state !== "healthy" ? COLOR[lp.state] : "#6f8a80";
  const loopAnnots = [];
  for (const lp of h.loops) for (let i = 1; i < lp.states.length; i++) if (lp.states[i] !== lp.states[i - 1]) {
    const s = STATES[+lp.states[i]];
    loopAnnots.push({ t: t[i], state: s, color: annotColor(s), short: `${lp.name.replace("loop-", "L")} ${label(s)}`, cls: "transition", label: `${fmtT(t[i])}: ${lp.name} ${label(STATES[+lp.states[i - 1]])} → ${label(s)}` });
  }
  const flow = h.loops.map(lp => ({ t, v: lp.flow_lpm.map(v => v == null ? null : 100 * v / lp.rated_flow_lpm), color: lineColor(lp), width: lp.name === sel ? 2.2 : 1.4, label: `${lp.name} (${label(lp.state)})` }));
  const supply = h.loops.map(lp => ({ t, v: lp.supply_c, color: lineColor(lp), width: lp.name === sel ? 2.2 : 1.4, label: `${lp.name} (${label(lp.state)})` }));
  const med = (b, f = x => x) => ({ t, v: b.p50.map(v => v == null ? null : f(v)), color: PEER, dash: "4 3", width: 1, label: "median of all loops", cls: "median" });
  $("loopflow").innerHTML = tsChart({
    width: widthOf("loopflow"), height: 170, t0, t1, unit: "% rated",
    bands: [band(h.flow_ratio_band, v => 100 * v)], series: [med(h.flow_ratio_band, v => 100 * v), ...flow],
    thresholds: [{ v: 100 * h.flow_ratio_concern, label: `evidence starts ${Math.round(100 * h.flow_ratio_concern)}%`, color: COLOR.degraded },
                 { v: 100 * h.flow_ratio_saturation, label: `saturates ${Math.round(100 * h.flow_ratio_saturation)}%`, color: COLOR.harmful }],
    annotations: loopAnnots,
  });
  $("loopsupply").innerHTML = tsChart({
    width: widthOf("loopsupply"), height: 170, t0, t1, unit: "°C",
    bands: [band(h.supply_c_band)], series: [med(h.supply_c_band), ...supply], annotations: loopAnnots,
  });
  const few = h.loops.length === h.loops_total;
  $("loopnote").textContent = (few ? `all ${h.loops_total} loops` : `${h.loops_total} loops: band = all loops; lines = ${h.loops.length ? h.loops.map(l => l.name).join(", ") : "none (every loop healthy in this window)"}`) + persistedNote(h.persisted, t);
  $("looplegend").innerHTML = h.loops.map(lp => `<span class="ent" data-kind="cooling_loop" data-name="${esc(lp.name)}" style="cursor:pointer"><i class="sw" style="background:${lineColor(lp)};height:3px;vertical-align:3px"></i>${esc(lp.name)} ${lp.state !== "healthy" ? stateBadge(lp.state) : ""}</span>`).join("") +
    `<span><i class="sw" style="background:${PEER};opacity:.4"></i>all loops 10th–90th pct</span>`;
}

// ---- fabric & storage ---------------------------------------------------------------------------
function drawCodes(cv, codes, kind) {
  st.fabricRects[kind] = [];
  const w = cv.parentElement.clientWidth || 600;
  const c = codes.length > 6000 ? 3 : codes.length > 2500 ? 4 : 6;
  const per = Math.max(1, Math.floor(w / (c + 1))), rows = Math.ceil(codes.length / per);
  const [ctx] = setupCanvas(cv, Math.max(4, rows * (c + 1)));
  for (let i = 0; i < codes.length; i++) {
    const x = (i % per) * (c + 1), y = Math.floor(i / per) * (c + 1);
    ctx.fillStyle = CODE_COLOR[+codes[i]]; ctx.fillRect(x, y, c, c);
    // Cells are in entity-index order; a click resolves the name through the API.
    st.fabricRects[kind].push({ x, y, w: c + 1, h: c + 1, kind, index: i, tip: `${kind} #${i} — ${label(STATES[+codes[i]])}` });
  }
}

const stateSum = f => STATES.filter(s => s !== "healthy" && f.states[s]).map(s => `${f.states[s].toLocaleString()} ${label(s)}`).join(", ");

function renderFabricKind(f, secId, cvId, noun) {
  const sec = $(secId), cv = $(cvId), note = sec.querySelector(".note");
  if (!f || f.total === 0) { cv.classList.add("hidden"); note.textContent = `none: this fleet has no ${noun}`; st.fabricRects[f ? f.kind : noun] = []; return; }
  const bad = stateSum(f);
  if (f.codes == null) {
    // Too many to draw one cell each: counts, and the non-healthy ones are listed below.
    cv.classList.add("hidden"); st.fabricRects[f.kind] = [];
    note.textContent = `${f.total.toLocaleString()} ${noun}: ${bad || "all healthy"}` + (bad ? ` — the worst ${f.not_healthy.length} are listed below` : "") + " (too many to draw one cell each)";
    return;
  }
  cv.classList.remove("hidden");
  drawCodes(cv, f.codes, f.kind);
  note.textContent = `${f.total.toLocaleString()} ${noun}: ${bad || "all healthy"}`;
}

function renderFabric(m) {
  const nic = m.fabric.find(f => f.kind === "nic"), link = m.fabric.find(f => f.kind === "link");
  renderFabricKind(nic, "nicsec", "nicmap", "NICs");
  renderFabricKind(link, "linksec", "linkmap", "links");
  $("fabricsum").textContent = `NICs: ${stateSum(nic) || "all healthy"} · links: ${stateSum(link) || "all healthy"}`;
  // Many paths: show the count and only the paths that are not healthy.
  const shown = m.storage.length > 48 ? m.storage.filter(e => e.state !== "healthy") : m.storage;
  const hiddenNote = shown.length < m.storage.length ? `<span class="muted small">${m.storage.length - shown.length} of ${m.storage.length} paths healthy (not listed)</span>` : "";
  $("storage").innerHTML = !m.storage.length ? `<span class="muted small">none: this fleet has no storage paths</span>` :
    hiddenNote + shown.map(e => `<span class="st ${e.state === "failed" ? "failed" : ""}" data-kind="storage" data-name="${esc(e.name)}" style="background:${e.state === "healthy" ? "#223" : COLOR[e.state]};color:${e.state === "healthy" ? "#aab" : "#111"}" title="${esc(e.name)}: ${label(e.state)}, GFS ${e.gfs}">${esc(e.name)}</span>`).join("");
  const bad = [...nic.not_healthy, ...link.not_healthy];
  $("fabricbad").innerHTML = bad.length ? `<span class="muted">not healthy:</span>` + bad.map(e => `<span class="st ${e.state === "failed" ? "failed" : ""}" data-kind="${e.kind}" data-name="${esc(e.name)}" style="border-color:${COLOR[e.state]}">${esc(e.name)} · ${label(e.state)}</span>`).join("") : `<span class="muted">no NIC or link is outside healthy</span>`;
}

// ---- timeline --------------------------------------------------------------------------------------
function renderTimeline(events, s) {
  st.events = events; st.eventsSummary = s;
  const only = $("actionsonly").checked;
  $("timeline").innerHTML = events.filter(e => !only || e.type === "action").map(e => {
    const color = e.type === "action" ? (e.status === "failed" ? COLOR.harmful : "#c9d1d9") : COLOR[e.state] || "#888";
    const kind = e.type === "action" ? "action" : e.kind;
    const ek = e.type === "action" ? "" : e.kind;
    return `<li class="${e.type}" data-t="${e.t_s}" data-kind="${esc(ek)}" data-name="${esc(e.entity)}"><span class="t">${fmtT(e.t_s)}</span><span class="dot" style="background:${color}"></span><span class="kind">${esc(kind)}</span><span class="what">${e.type === "transition" ? "<b>" + esc(e.entity) + "</b> " : ""}${esc(e.text)}</span></li>`;
  }).join("") || `<li class="muted">No transitions or actions yet.</li>`;
  const svg = $("timestrip"), w = svg.clientWidth || 600, [t0, t1] = chartWindow();
  const x = t => 4 + (w - 8) * (t - t0) / Math.max(t1 - t0, 1);
  let out = `<line x1="4" y1="17" x2="${w - 4}" y2="17" stroke="#2a343f"/>`;
  for (const e of events) {
    if (e.t_s < t0 || e.t_s > t1) continue;
    const c = e.type === "action" ? "#c9d1d9" : COLOR[e.state] || "#888";
    out += e.type === "action" ? `<rect x="${x(e.t_s) - 2}" y="5" width="4" height="10" fill="${c}"><title>${esc(e.text)}</title></rect>`
      : `<circle cx="${x(e.t_s)}" cy="24" r="3" fill="${c}"><title>${esc(e.entity + " " + e.text)}</title></circle>`;
  }
  out += `<text x="4" y="33" fill="#8995a3" font-size="10">${fmtT(t0)}</text><text x="${w - 4}" y="33" fill="#8995a3" font-size="10" text-anchor="end">${fmtT(t1)} (${esc(timeTitle(t1))})</text>`;
  svg.innerHTML = out;
}

// ---- throughput ----------------------------------------------------------------------------------
// Useful throughput over the window, from /history/fleet (memory, and the ledger before it).
function renderTputChart(h) {
  const [t0, t1] = chartWindow();
  const pts = h.t_s.map((t, i) => ({ t_s: t, with_control: h.useful_with[i], without_control: h.useful_without[i] })).filter(p => p.with_control != null && p.t_s >= t0 && p.t_s <= t1);
  if (!pts.length) $("tput").innerHTML = `<div class="muted small">${st.tput && !st.tput.series.length ? "this source reports no useful-work figure" : "no throughput samples in this window"}</div>`;
  else {
    const t = pts.map(p => p.t_s);
    const hasWo = pts.some(p => p.without_control != null);
    $("tput").innerHTML = tsChart({
      width: widthOf("tput"), height: 160, t0, t1, unit: "% of ideal", yMax: 100,
      yTick: v => v.toFixed(v % 1 ? 1 : 0) + "%",
      series: [...(hasWo ? [{ t, v: pts.map(p => p.without_control == null ? null : 100 * p.without_control), color: COLOR.quarantine, dash: "5 3", width: 1.5, label: "without control (counterfactual twin)" }] : []),
               { t, v: pts.map(p => 100 * p.with_control), color: LINE, width: 2, label: "with seamguard" }],
    }) + `<div class="legend small"><span><i class="sw" style="background:${LINE};height:3px;vertical-align:3px"></i>with seamguard</span>${hasWo ? `<span><i class="sw" style="background:${COLOR.quarantine};height:3px;vertical-align:3px"></i>without (counterfactual, dashed)</span>` : ""}<span class="muted">${esc(persistedNote(h.persisted, t))}</span></div>`;
  }
}

function renderThroughput(tp) {
  const d = tp.useful_with_control != null && tp.useful_without_control != null ? tp.useful_with_control - tp.useful_without_control : null;
  $("tputstats").innerHTML = [
    ["useful throughput with control", `<b>${pct(tp.useful_with_control)}</b>`],
    ["without control", `<b>${pct(tp.useful_without_control)}</b>${d != null ? ` (${d >= 0 ? "+" : ""}${(100 * d).toFixed(1)} pts)` : ""}`],
    ["GPU-hours saved so far", `<b>${num(tp.gpu_hours_saved)}</b> GPU-h`],
    ["job failures with / without", `<b>${tp.job_failures_with_control ?? "—"} / ${tp.job_failures_without_control ?? "—"}</b>`],
    [`<abbr title="${esc(GLOSS.FAE)}">FAE</abbr> contained (taken out of the critical path)`, `<b>${num(tp.fae_contained_gpu_h_per_h)}</b> GPU-h/h`],
    [`<abbr title="${esc(GLOSS.FAE)}">FAE</abbr> still in effect`, `<b>${num(tp.fae_in_effect_gpu_h_per_h)}</b> GPU-h/h`],
  ].map(([k, v]) => `<div class="muted">${k}</div><div>${v}</div>`).join("");
}

// ---- jobs and gray entities -------------------------------------------------------------------------
function renderJobs(jobs) {
  $("jobs").innerHTML = `<tr><th>job</th><th class="num">GPUs</th><th>state</th><th class="num" title="non-healthy nodes / nodes">exp.</th><th class="num">useful</th><th class="num" title="without control (counterfactual)">w/o</th></tr>` +
    jobs.map(j => {
      const exposed = j.nodes - (j.exposure.healthy || 0);
      return `<tr class="click" data-kind="job" data-name="${esc(j.name)}" title="crit ${j.criticality}; exposed to ${esc(j.exposed_to.join(", ") || "nothing")}"><td>${esc(j.name.split("-").slice(0, 2).join("-"))}<div class="muted small">${esc(label(j.job_class))} · crit ${j.criticality}</div></td><td class="num">${j.gpus}</td><td>${stateBadge(j.state)}</td><td class="num">${exposed}/${j.nodes}</td><td class="num">${pct(j.useful_throughput)}</td><td class="num muted">${pct(j.useful_throughput_without_control)}</td></tr>`;
    }).join("");
}

// ---- goodput (measured): each job's wall time by cause, the fleet's ETTR; /api/v1/goodput ----------
const GP_COLOR = { productive: "#3fb950", checkpoint_stall: "#8b949e", rollback: "#d29922", restart: "#f85149",
                   straggler: "#a371f7", degraded: "#58a6ff", unattributed: "#6e7681" };
const GP_JOBS = 12;  // bars drawn: the jobs with the lowest ETTR first
const gpLost = j => Object.entries(j.by_cause_s).filter(([c]) => c !== "productive").reduce((a, [, v]) => a + v, 0);

async function refreshGoodput() {
  const [t0, t1] = chartWindow();
  const g = await api(`${API}/goodput?since=${t0.toFixed(3)}&until=${t1.toFixed(3)}&buckets=48`);
  st.goodput = g; renderGoodput(g, t0, t1);
}

function gpBar(j) {
  const segs = Object.entries(j.by_cause_s).filter(([, v]) => v > 0).map(([c, v]) =>
    `<div style="width:${(100 * v / j.wall_s).toFixed(3)}%;background:${GP_COLOR[c] || "#888"}" title="${esc(label(c))}: ${fmtDur(v)} (${pct(v / j.wall_s)})"></div>`).join("");
  return `<div class="gprow" data-job="${esc(j.job)}"><div class="gpname"><span>${esc(j.job)}</span><span class="muted">ETTR ${pct(j.ettr)} · lost ${fmtDur(gpLost(j))}</span></div><div class="gpbar">${segs}</div></div>`;
}

const fmtDur = s => s >= 3600 ? (s / 3600).toFixed(1) + " h" : s >= 60 ? (s / 60).toFixed(1) + " min" : s.toFixed(1) + " s";

function renderGoodput(g, t0, t1) {
  const jobs = g.jobs.filter(j => j.wall_s > 0).sort((a, b) => (a.ettr ?? 1) - (b.ettr ?? 1)).slice(0, GP_JOBS);
  const f = g.fleet;
  $("gpsum").textContent = f.ettr == null ? "measured: no job reported its step in this range"
    : `fleet ETTR ${pct(f.ettr)} over ${g.jobs.filter(j => j.wall_s > 0).length} job(s), ${fmtDur(f.wall_s)} of job time (series: ${g.source})`;
  $("gpbars").innerHTML = jobs.length ? jobs.map(gpBar).join("")
    : `<div class="muted">no job reported <code>seamguard_job_step</code> in this range (the runtime exports it: seamguard launch --metrics-port)</div>`;
  $("gplegend").innerHTML = g.causes.map(c => `<span><i class="sw" style="background:${GP_COLOR[c]}"></i>${esc(label(c))}</span>`).join("");
  const b = g.ettr_over_time.filter(p => p.ettr != null);
  $("gpettr").innerHTML = b.length ? tsChart({
    width: widthOf("gpettr"), height: 120, t0, t1, yMin: 0, yMax: 100, unit: "% ETTR", yTick: v => v.toFixed(0) + "%",
    series: [{ t: b.map(p => (p.t0_s + p.t1_s) / 2), v: b.map(p => 100 * p.ettr), color: LINE, width: 2, label: "fleet ETTR" }],
  }) : `<div class="muted small">no job time in this range</div>`;
  // A live cluster reports no useful-work figure to the twin's panel: show the measured one there.
  if (st.tput && st.tput.useful_with_control == null) {
    $("tputsub").textContent = "twin only; measured goodput of this cluster instead";
    $("tputstats").innerHTML = [
      ["measured ETTR (goodput) over the range", `<b>${pct(f.ettr)}</b>`],
      ...g.causes.filter(c => c !== "productive" && f.by_cause_s[c] > 0).map(c => [`lost to ${esc(label(c))}`, `<b>${fmtDur(f.by_cause_s[c])}</b>`]),
    ].map(([k, v]) => `<div class="muted">${k}</div><div>${v}</div>`).join("");
    // and the Jobs table's "useful" column (the twin's figure) shows each job's measured ETTR
    const byJob = Object.fromEntries(g.jobs.map(j => [j.job, j]));
    for (const tr of document.querySelectorAll("#jobs tr[data-name]")) {
      const j = byJob[tr.dataset.name], td = tr.children[4];
      if (j && td && j.ettr != null) { td.textContent = pct(j.ettr); td.title = "measured ETTR (goodput) over the range"; }
    }
  }
}

async function refreshGray() {
  const bad = STATES.slice(1).map(s => "state=" + s).join("&");
  const [g, n, o] = await Promise.all([
    api(`${API}/entities?kind=gpu&${bad}&sort=gfs&limit=12`),
    api(`${API}/entities?kind=node&${bad}&sort=fae&limit=8`),
    api(`${API}/entities?kind=cooling_loop&${bad}&sort=gfs&limit=5`)]);
  const rows = [...o.items, ...n.items, ...g.items];
  $("graycount").textContent = `${o.total} loops · ${n.total} nodes · ${g.total} GPUs not healthy`;
  $("gray").innerHTML = `<tr><th>entity</th><th>state</th><th class="num"><abbr title="${esc(GLOSS.GFS)}">GFS</abbr></th><th class="num"><abbr title="${esc(GLOSS.FAE)}">FAE</abbr> GPU-h/h</th></tr>` + (rows.length ? rows.map(e =>
    `<tr class="click" data-kind="${e.kind}" data-name="${esc(e.name)}"><td>${esc(e.name)} <span class="muted">${e.kind}</span>${e.pinned ? " 📌" : ""}</td><td>${stateBadge(e.state)}</td><td class="num">${e.gfs.toFixed(2)}</td><td class="num">${num(e.fae)}</td></tr>`).join("") : `<tr><td colspan="4" class="muted">none: every loop, node and GPU is healthy</td></tr>`);
}

// ---- entity detail ------------------------------------------------------------------------------------
const shortSig = n => n.replace(/^DCGM_FI_DEV_|^node_infiniband_|^seamguard_/, "");

function signalChart(sig, d, opts = {}) {
  const ok = sig.values.filter(v => v != null);
  const head = `<div class="lbl" title="${esc(sig.help)}">${esc(opts.title || shortSig(sig.name))} <b>${fmtVal(ok.length ? ok[ok.length - 1] : null, sig.unit)}</b> <span class="muted">${esc(sig.help)}</span></div>`;
  if (sig.t_s.length < 2 || !ok.length) return `<div class="sig" data-signal="${esc(sig.name)}">${head}<div class="muted small">no samples in this window</div></div>`;
  const [t0, t1] = chartWindow();
  const bands = sig.peer_p10.length ? [{ t: sig.t_s, lo: sig.peer_p10, hi: sig.peer_p90, label: "peers: " + sig.peers }] : [];
  const series = [];
  if (sig.peer_p50.length) series.push({ t: sig.t_s, v: sig.peer_p50, color: PEER, dash: "4 3", width: 1, label: "peer median", cls: "median" });
  series.push({ t: sig.t_s, v: sig.values, color: LINE, width: 1.8, label: d.entity.name });
  const thColors = [COLOR.harmful, COLOR.quarantine, COLOR.degraded];
  const thresholds = (opts.thresholds || sig.thresholds.map((x, i) => ({ v: x.value, label: x.label, color: sig.thresholds.length === 2 ? [COLOR.degraded, COLOR.harmful][i] : thColors[i % 3] })));
  const chart = tsChart({
    width: opts.width || widthOf("detail"), height: opts.height || 112, t0, t1, unit: unitLabel(sig.unit), yMin: opts.yMin, yMax: opts.yMax,
    bands, series, thresholds, annotations: transAnnots(d.history), strip: segments(d.history, d.state_at_since, t0, t1),
  });
  return `<div class="sig" data-signal="${esc(sig.name)}">${head}${chart}</div>`;
}

function evidenceTable(d) {
  const now = Object.fromEntries(d.evidence.map(r => [r.channel, r]));
  const at = d.entered_by ? Object.fromEntries(d.entered_by.reasons.map(r => [r.channel, r])) : {};
  const chans = [...new Set([...Object.keys(at), ...Object.keys(now)])].filter(c => c !== "operator_pin" || at[c]);
  if (!chans.length) return `<div class="muted small">no evidence above the noise floor</div>`;
  const when = d.entered_by ? `at transition<br><span class="muted">${fmtT(d.entered_by.t_s)} → ${esc(label(d.entered_by.to_state))}</span>` : "";
  const bar = s => `<div class="bar" title="score ${s.toFixed(2)}"><div style="width:${Math.round(s * 100)}%;background:${s >= .8 ? COLOR.harmful : s >= .5 ? COLOR.degraded : "#9cc3ff"}"></div></div>`;
  return `<table class="tbl" id="evidence"><tr><th>evidence channel</th>${d.entered_by ? `<th class="num at">${when}</th>` : ""}<th class="num now">now<br><span class="muted">${fmtT(st.summary ? st.summary.t_s : 0)}</span></th><th>score now</th></tr>` +
    chans.map(c => {
      const a = at[c], n = now[c];
      return `<tr data-channel="${esc(c)}"><td>${esc(c)}</td>${d.entered_by ? `<td class="num at">${a ? fmtVal(a.value, a.unit) + ` <span class="muted">(${a.score.toFixed(2)})</span>` : "—"}</td>` : ""}<td class="num now">${n ? fmtVal(n.value, n.unit) : "—"}</td><td style="width:80px">${n ? bar(n.score) : ""}</td></tr>`;
    }).join("") + `</table><div class="muted small">values with units; (n) = the channel's score 0–1 at the transition</div>`;
}

function scoreBox(name, v, max, unit) {
  const w = Math.max(0, Math.min(1, v / max)) * 100;
  return `<div class="score" title="${esc(GLOSS[name])}"><span>${name}${unit ? " " + unit : ""}</span><b>${num(v)}</b><div class="bar"><div style="width:${w}%"></div></div><p>${esc(GLOSS[name].split(":")[0].split(",")[0])}</p></div>`;
}

function renderDetail(d) {
  const e = d.entity, th = d.thresholds;
  const parents = Object.entries(d.parents).map(([k, v]) => `<span class="muted">${k}</span> <a class="ent" data-kind="${k === "leaf" || k === "spine" ? "" : k}" data-name="${esc(v)}">${esc(v)}</a>`).join(" · ");
  const kids = d.children.map(c => `${c.kind}s: ` + STATES.filter(s => c.states[s]).map(s => `${c.states[s]} ${label(s)}`).join(", ")).join(" · ");
  const hist = d.history.slice(0, 12).map(t => `<tr><td class="muted">${fmtT(t.t_s)}</td><td>${esc(label(t.from_state))} → ${stateBadge(t.to_state)}</td><td class="small">${esc(t.reasons.slice(0, 2).map(r => `${r.channel} ${fmtVal(r.value, r.unit)}`).join(", "))}</td></tr>`).join("");
  const acts = d.actions.slice(0, 10).map(a => `<tr><td class="muted">${fmtT(a.t_s)}</td><td>${esc(a.op)} <b>${esc(a.verb)}</b> ${esc(a.target)} <span class="muted">[${esc(a.status)}]</span></td><td class="small">${esc(a.reason)}</td></tr>`).join("");
  const decs = d.decisions.filter(x => x.event === "held_by_breaker").slice(0, 3).map(x => `<div class="small" style="color:${COLOR.quarantine}">held by breaker at ${fmtT(x.t_s)}: ${esc(x.verb)} ${esc(x.target)}</div>`).join("");
  const pinnable = ["cooling_loop", "rack", "gpu", "nic", "link", "storage"].includes(e.kind);
  const pin = !pinnable ? "" : d.pin ? `<div class="pinform"><span>📌 pinned <b>${esc(d.pin.state)}</b> by ${esc(d.pin.by)}: ${esc(d.pin.note)}</span><button id="unpin">Unpin</button></div>`
    : `<div class="pinform"><select id="pinstate">${STATES.map(s => `<option value="${s}">${s}</option>`).join("")}</select><input id="pinnote" placeholder="note (why)" maxlength="500"><button id="pinbtn">Pin state</button></div>`;
  const w = widthOf("detail");
  const gfs = signalChart(d.gfs_series, d, {
    title: "GFS", yMin: 0, yMax: 1, width: w, height: 140,
    thresholds: [{ v: th.quarantine_enter, label: `quarantine ≥ ${th.quarantine_enter}`, color: COLOR.quarantine },
                 { v: th.degrade_enter, label: `degrade ≥ ${th.degrade_enter}`, color: COLOR.degraded },
                 { v: th.degrade_exit, label: `recover < ${th.degrade_exit}`, color: "#7fa393" }],
  });
  const [w0, w1] = chartWindow(), gt = d.gfs_series.t_s;
  const older = d.entered_by && d.entered_by.t_s < w0 ? `<div class="muted small">entered ${esc(label(e.state))} at ${fmtT(d.entered_by.t_s)}, before this window</div>` : "";
  const fromLedger = persistedNote(d.persisted, gt);
  const ringNote = fromLedger ? ` GFS and signals${fromLedger}: ${d.persisted.rule}; the peer band covers the controller's last ticks only.`
    : gt.length && gt[0] > w0 + 1 ? ` Signals are kept for the controller's last ticks (from ${fmtT(gt[0])})${d.persisted ? `; before them the ledger has none of this ${esc(e.kind)} (${d.persisted.rule})` : ""}; state changes and actions come from the ledger over the whole window.` : "";
  $("detail").className = "detail";
  $("detail").dataset.kind = e.kind; $("detail").dataset.name = e.name; $("detail").dataset.state = e.state;
  $("detail").innerHTML = `
    <h3>${esc(e.name)} <span class="muted small">${esc(e.kind)}</span> ${stateBadge(e.state)} ${e.pinned ? "📌" : ""}</h3>
    <div class="small">${parents}</div>
    <div class="scores">${scoreBox("GFS", e.gfs, 1)}${scoreBox("PRS", e.prs, 1)}${scoreBox("FAE", e.fae, Math.max(1, e.fae), "GPU-h/h")}</div>
    <div class="glossary small" id="gloss"><b>GFS</b> ${esc(GLOSS.GFS.replace(/^gray-failure score, /, "gray-failure score: "))}; thresholds here: degrade ≥ ${th.degrade_enter}, quarantine ≥ ${th.quarantine_enter}, recover < ${th.degrade_exit}.<br><b>PRS</b> ${esc(GLOSS.PRS.replace("256", th.prs_scale_gpus))} (≥ ${th.harmful_prs}).<br><b>FAE</b> ${esc(GLOSS.FAE)}.</div>
    <div class="why" id="why">${esc(d.why)}</div>
    ${decs}
    ${evidenceTable(d)}
    ${kids ? `<div class="small muted" style="margin-top:6px">${esc(kids)}</div>` : ""}
    <div class="sub">over ${fmtT(w0)} – ${fmtT(w1)} (${gt.length} points). White: this ${esc(e.kind)}; grey band: ${esc(d.gfs_series.peers || "no peers")}, dashed grey: their median; coloured dashed verticals: its state changes; strip under each axis: its state.${esc(ringNote)}</div>
    ${older}
    <div id="tsgfs">${gfs}</div>
    <div id="tssignals">${d.signals.map(s => signalChart(s, d)).join("")}</div>
    <div class="sub">state history in this window</div>${hist ? `<table class="tbl" id="entityhistory">${hist}</table>` : `<div class="muted small" id="entityhistory">no transitions recorded in this window</div>`}
    <div class="sub">actions in this window</div>${acts ? `<table class="tbl" id="entityactions">${acts}</table>` : `<div class="muted small">no actions on it or its node in this window</div>`}
    ${pin}`;
  const pb = $("pinbtn"), ub = $("unpin");
  if (pb) pb.onclick = () => authed("PUT", `${API}/pins/${e.kind}/${e.name}`, { state: $("pinstate").value, note: $("pinnote").value || "pinned from the dashboard" }).then(() => refreshDetail()).catch(showErr);
  if (ub) ub.onclick = () => authed("DELETE", `${API}/pins/${e.kind}/${e.name}`).then(() => refreshDetail()).catch(showErr);
}

function select(kind, name) {
  if (!kind || !name) return;
  // On a large fleet (tiles, or already drilled into a loop) selecting a loop drills into it.
  if (kind === "cooling_loop" && st.map && (st.map.aggregated || st.loop) && st.loop !== name) { st.loop = name; refreshMap().catch(showErr); }
  st.selected = { kind, name };
  writeURL();
  refreshDetail().catch(showErr);
  refreshFleet().catch(showErr);
  drawMap();
}

async function refreshDetail() {
  if (!st.selected) return;
  const { kind, name } = st.selected;
  const d = await api(`${API}/entities/${kind}/${name.split("/").map(encodeURIComponent).join("/")}?points=240&history=30&${rangeQS()}`);
  renderDetail(d);
}

// ---- polling ---------------------------------------------------------------------------------------
async function refreshMap() {
  st.map = await api(`${API}/map` + (st.loop ? `?loop=${encodeURIComponent(st.loop)}` : ""));
  drawMap(); renderFabric(st.map);
}

async function refreshFleet() {
  const sel = st.selected && st.selected.kind === "cooling_loop" ? st.selected.name : st.loop;
  const [h, g, n] = await Promise.all([
    api(`${API}/history/fleet?points=360&${rangeQS()}` + (sel ? `&loop=${encodeURIComponent(sel)}` : "")),
    api(`${API}/history/states?kind=gpu&points=360&${rangeQS()}`), api(`${API}/history/states?kind=node&points=360&${rangeQS()}`)]);
  st.fleetHist = h; st.stateHist = [g, n];
  renderStateHistory(st.stateHist); renderFleetHistory(h);
}

async function refreshAll(s) {
  // Where history begins (the ledger's first tick): charts never open before it.
  const probe = await api(`${API}/history/states?kind=gpu&points=2&${rangeQS()}`);
  st.historyStart = probe.complete_since_t_s;
  renderRange();
  const [tl, tp, jobs] = await Promise.all([api(`${API}/timeline?limit=150&${rangeQS()}`), api(`${API}/throughput`), api(`${API}/jobs`)]);
  renderTimeline(tl, s);
  await refreshMap();
  st.tput = tp; renderThroughput(tp); renderJobs(jobs);
  await Promise.all([refreshGray(), refreshDetail(), refreshFleet(), refreshGoodput()]);
  document.body.dataset.view = viewHash();
}

function showErr(e) { if (e && e.message !== "no token") banner("error: " + e.message); }

async function poll() {
  if (st.busy) return;
  st.busy = true;
  try {
    const s = await api(`${API}/summary`);
    st.summary = s; renderHeader(s);
    if (s.tick !== st.tick || st.dirty) { st.tick = s.tick; st.dirty = false; await refreshAll(s); }
    document.body.dataset.tick = String(s.tick);
  } catch (e) { showErr(e); }
  finally { st.busy = false; }
}

// ---- wiring ---------------------------------------------------------------------------------------
document.addEventListener("click", ev => {
  const t = ev.target.closest("[data-name]");
  if (t && t.dataset.kind) { select(t.dataset.kind, t.dataset.name); return; }
  const c = ev.target.closest("[data-loop]");
  if (c) { st.loop = c.dataset.loop || null; writeURL(); refreshMap().catch(showErr); refreshFleet().catch(showErr); }
});
$("token").value = localStorage.getItem("seamguard.token") || "";
$("token").addEventListener("change", () => localStorage.setItem("seamguard.token", $("token").value.trim()));
$("mode").onclick = () => { const next = st.summary && st.summary.mode === "enforce" ? "dry_run" : "enforce"; authed("PUT", `${API}/mode`, { mode: next }).then(poll).catch(showErr); };
$("breaker").onclick = () => {
  if (!(st.summary && st.summary.breaker.tripped)) return;
  const why = window.prompt(`Reset the safety breaker? It tripped: ${st.summary.breaker.reason}\nWhy may it act again? (recorded in the ledger)`);
  if (why && why.trim()) authed("POST", `${API}/breaker/reset`, { why: why.trim() }).then(poll).catch(showErr);
};
bindCanvas($("fleetmap"), () => st.rects);
$("actionsonly").addEventListener("change", () => { writeURL(); if (st.events) renderTimeline(st.events, st.eventsSummary); });
$("worstfirst").addEventListener("change", () => { writeURL(); drawMap(); });
$("range").addEventListener("change", () => { if (RANGES[$("range").value]) setView({ range: $("range").value, since: null, until: null }); });
$("zoomin").onclick = () => zoomBy(0.5);
$("zoomout").onclick = () => zoomBy(2);
$("zoomreset").onclick = () => setView({ since: null, until: null });
// A pasted link, the back button or an edited hash: show what it names.
window.addEventListener("hashchange", () => { readURL(); renderRange(); st.dirty = true; if (st.selected) refreshDetail().catch(showErr); else $("detail").textContent = "Nothing selected."; poll(); });
bindZoom();
bindCanvas($("nicmap"), () => st.fabricRects.nic);
bindCanvas($("linkmap"), () => st.fabricRects.link);
window.addEventListener("resize", () => { drawMap(); if (st.map) renderFabric(st.map); if (st.stateHist) renderStateHistory(st.stateHist); if (st.fleetHist) renderFleetHistory(st.fleetHist); });
legend();
$("graygloss").innerHTML = `<b>GFS</b> ${esc(GLOSS.GFS)}. <b>FAE</b> ${esc(GLOSS.FAE)}.`;

// For tests and operators' scripts: where things are drawn on the map canvas.
function toPage(r) { const b = $("fleetmap").getBoundingClientRect(); return { x: b.left + r.x + r.w / 2, y: b.top + r.y + r.h / 2, cx: r.x + r.w / 2, cy: r.y + r.h / 2, w: r.w, h: r.h }; }
window.seamguard = {
  cellCenter(name) { const r = st.rects.find(x => x.kind === "gpu" && x.name === name); return r ? toPage(r) : null; },
  nodeRect(name) { const r = st.nodeRects.find(x => x.name === name); return r ? { ...toPage(r), x0: r.x, y0: r.y, state: r.state } : null; },
  gpuCellsOf(node) { return st.rects.filter(x => x.kind === "gpu" && x.name.startsWith(node + "/")).map(x => ({ name: x.name, state: x.state, ...toPage(x) })); },
  tiles() { return st.tiles.map(t => ({ ...t })); },
  colors: COLOR, states: STATES, get tick() { return st.tick; },
  view() { const [t0, t1] = chartWindow(); return { ...view, hash: viewHash(), t0, t1, selected: st.selected, loop: st.loop }; },
};
readURL();
writeURL();
poll();
setInterval(poll, POLL_MS);
