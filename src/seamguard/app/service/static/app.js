// seamguard dashboard: a renderer of the API's snapshot. No framework, no build step.
// Polls /api/v1/summary; when the controller's tick moves, redraws the map, fabric,
// timeline, throughput, jobs and the selected entity. Large fleets are drawn as
// per-loop aggregates on canvas and drilled into on click (never one DOM node per GPU).
"use strict";

const API = "/api/v1";
const STATES = ["healthy", "degraded", "checkpoint_unsafe", "quarantine", "harmful", "failed"];
const css = getComputedStyle(document.documentElement);
const COLOR = Object.fromEntries(STATES.map(s => [s, css.getPropertyValue("--" + s).trim()]));
const CODE_COLOR = STATES.map(s => COLOR[s]);
const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 8000;

const st = {
  tick: null, summary: null, map: null, loop: null, selected: null, busy: false,
  rects: [], fabricRects: { nic: [], link: [] }, lastError: "",
};

const $ = id => document.getElementById(id);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmtT = t => (t >= 3600 ? (t / 3600).toFixed(1) + " h" : t >= 60 ? (t / 60).toFixed(1) + " min" : Math.round(t) + " s");
const pct = x => (x == null ? "—" : (100 * x).toFixed(1) + "%");
const num = (x, d = 3) => (x == null ? "—" : Math.abs(x) >= 1000 ? x.toFixed(0) : Number(x).toPrecision(d));
const stateBadge = s => `<span class="state" style="background:${COLOR[s]}">${esc(s.replace("_", " "))}</span>`;

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

// ---- header -------------------------------------------------------------------------------
function renderHeader(s) {
  $("source").textContent = `${s.source} · ${s.sizes.gpu.toLocaleString()} GPUs · ${s.sizes.node.toLocaleString()} nodes · ${s.sizes.cooling_loop} loops`;
  $("clock").textContent = `t=${fmtT(s.t_s)} · tick ${s.tick} · ${(s.timing.tick_s * 1000).toFixed(0)} ms`;
  const g = s.states.gpu, n = s.states.node;
  $("chips").innerHTML = STATES.filter(x => x === "healthy" || g[x] || n[x]).map(x =>
    `<span class="chip" title="GPUs / nodes ${x}"><i style="background:${COLOR[x]}"></i>${x.replace("_", " ")} ${g[x].toLocaleString()} / ${n[x].toLocaleString()}</span>`).join("");
  const mode = $("mode"); mode.textContent = s.mode === "enforce" ? "enforcing" : "dry run"; mode.className = "badge " + s.mode;
  const br = $("breaker"); br.className = "badge " + (s.breaker.tripped ? "tripped" : "closed");
  br.textContent = s.breaker.tripped ? "breaker TRIPPED — reset" : `breaker ok · ${s.breaker.disrupted_nodes_in_window}`;
  br.title = s.breaker.tripped ? s.breaker.reason : "safety breaker: closed";
  banner(s.timing.error ? "last tick failed: " + s.timing.error : (s.breaker.tripped ? "Safety breaker tripped: " + s.breaker.reason + " — no new drains until reset." : ""));
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
  $("legend").innerHTML = STATES.map(s => `<span><i style="background:${COLOR[s]}"></i>${s.replace("_", " ")}</span>`).join("");
}

function drawMap() {
  const m = st.map; if (!m) return;
  const cv = $("fleetmap");
  st.rects = [];
  $("crumbs").innerHTML = st.loop ? `<a data-loop="">all loops</a> › ${esc(st.loop)}` : (m.aggregated ? "all loops (aggregated: click a loop to drill down)" : "all loops");
  if (m.aggregated && !st.loop) return drawLoopTiles(cv, m);
  return drawDetail(cv, m.detail);
}

function drawLoopTiles(cv, m) {
  const w0 = cv.parentElement.clientWidth || 600;
  const size = 22, gap = 4, per = Math.max(1, Math.floor((w0 + gap) / (size + gap)));
  const rows = Math.ceil(m.loops.length / per);
  const [ctx] = setupCanvas(cv, rows * (size + gap) + 4);
  m.loops.forEach((lp, i) => {
    const x = (i % per) * (size + gap), y = Math.floor(i / per) * (size + gap) + 2;
    const total = STATES.reduce((a, s) => a + lp.gpu_states[s], 0) || 1;
    ctx.fillStyle = COLOR.healthy; ctx.fillRect(x, y, size, size);
    // Fill from the bottom with the share of non-healthy GPUs, worst on top.
    let yy = y + size;
    for (let k = STATES.length - 1; k >= 1; k--) {
      const h = Math.ceil(size * lp.gpu_states[STATES[k]] / total);
      if (h > 0) { ctx.fillStyle = COLOR[STATES[k]]; yy -= h; ctx.fillRect(x, Math.max(y, yy), size, Math.min(h, yy + h - y)); }
    }
    if (lp.worst !== "healthy") { ctx.strokeStyle = COLOR[lp.worst]; ctx.lineWidth = 2; ctx.strokeRect(x + 1, y + 1, size - 2, size - 2); }
    st.rects.push({ x, y, w: size, h: size, kind: "loop", name: lp.name, tip: loopTip(lp) });
  });
  const bad = m.loops.filter(l => l.worst !== "healthy").length;
  $("maphint").textContent = `${m.loops.length} cooling loops; ${bad} with non-healthy GPUs, nodes or facilities. Each tile fills with its share of non-healthy GPUs.`;
}

function loopTip(lp) {
  const parts = STATES.filter(s => lp.gpu_states[s]).map(s => `${s.replace("_", " ")} ${lp.gpu_states[s]}`);
  return `${lp.name} (${lp.worst}) — GPUs: ${parts.join(", ")}`;
}

function drawDetail(cv, loops) {
  const w = cv.parentElement.clientWidth || 600;
  let maxGpn = 1, maxNpr = 1, maxRpl = 1;
  for (const lp of loops) { maxRpl = Math.max(maxRpl, lp.racks.length); for (const r of lp.racks) { maxNpr = Math.max(maxNpr, r.nodes.length); for (const g of r.gpu_states) maxGpn = Math.max(maxGpn, g.length); } }
  const single = loops.length === 1;
  const layout = (c, rpr) => {
    const nodeW = maxGpn * (c + 1) + 2, rackW = nodeW + 8, rackH = maxNpr * (c + 2) + 16;
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
    ctx.fillText(`${lp.loop}${lp.state !== "healthy" ? "  · " + lp.state : ""}`, lx + 6, ly + 5);
    st.rects.push({ x: lx, y: ly, w: L.loopW, h: 18, kind: "cooling_loop", name: lp.loop, tip: `${lp.loop}: ${lp.state} (click for the loop)` });
    lp.racks.forEach((r, ri) => {
      const rx = lx + 6 + (ri % L.rpr) * (L.rackW + 6), ry = ly + 22 + Math.floor(ri / L.rpr) * (L.rackH + 6);
      ctx.fillStyle = "#141a20"; ctx.fillRect(rx, ry, L.rackW, L.rackH);
      ctx.fillStyle = "#77828e"; ctx.fillText(r.name.replace("rack-", "r"), rx + 3, ry + 2);
      st.rects.push({ x: rx, y: ry, w: L.rackW, h: 13, kind: "rack", name: r.name, tip: r.name });
      r.nodes.forEach((node, ni) => {
        const nx = rx + 4, ny = ry + 14 + ni * (cell + 2);
        const ns = STATES[+r.node_states[ni]];
        if (ns !== "healthy") { ctx.fillStyle = COLOR[ns]; ctx.fillRect(nx - 3, ny, 2, cell); }
        const codes = r.gpu_states[ni];
        for (let g = 0; g < codes.length; g++) {
          const gx = nx + g * (cell + 1);
          ctx.fillStyle = CODE_COLOR[+codes[g]]; ctx.fillRect(gx, ny, cell, cell);
          const name = r.gpu_names[ni][g];
          st.rects.push({ x: gx, y: ny, w: cell, h: cell, kind: "gpu", name, tip: `${name} — ${STATES[+codes[g]]} (node ${node}: ${ns})` });
          if (st.selected && st.selected.kind === "gpu" && st.selected.name === name) {
            ctx.strokeStyle = "#fff"; ctx.lineWidth = 2; ctx.strokeRect(gx - 1, ny - 1, cell + 2, cell + 2);
          }
        }
      });
    });
  });
  const n = loops.reduce((a, lp) => a + lp.racks.reduce((b, r) => b + r.gpu_states.reduce((c, g) => c + g.length, 0), 0), 0);
  $("maphint").textContent = `${n.toLocaleString()} GPUs drawn: cooling loop → rack → node (row) → GPU (cell). Click a GPU for its evidence, a rack or loop label for its summary.`;
}

function hit(rects, cv, ev) {
  const b = cv.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
  // Later rects are smaller (GPU cells drawn over their rack and loop): search from the end.
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
    if (r.kind === "loop") { st.loop = r.name; refreshMap().catch(showErr); return; }
    if (r.index != null && !r.name) {
      api(`${API}/entities?kind=${r.kind}&limit=1&offset=${r.index}`).then(p => p.items[0] && select(r.kind, p.items[0].name)).catch(showErr);
      return;
    }
    select(r.kind, r.name);
  });
}

// ---- fabric & storage ---------------------------------------------------------------------------
function drawCodes(cv, codes, kind) {
  st.fabricRects[kind] = [];
  if (codes == null) { setupCanvas(cv, 4); return; }
  const w = cv.parentElement.clientWidth || 600;
  const c = codes.length > 6000 ? 3 : codes.length > 2500 ? 4 : 6;
  const per = Math.max(1, Math.floor(w / (c + 1))), rows = Math.ceil(codes.length / per);
  const [ctx] = setupCanvas(cv, Math.max(4, rows * (c + 1)));
  for (let i = 0; i < codes.length; i++) {
    const x = (i % per) * (c + 1), y = Math.floor(i / per) * (c + 1);
    ctx.fillStyle = CODE_COLOR[+codes[i]]; ctx.fillRect(x, y, c, c);
    // Cells are in entity-index order; a click resolves the name through the API.
    st.fabricRects[kind].push({ x, y, w: c + 1, h: c + 1, kind, index: i, tip: `${kind} #${i} — ${STATES[+codes[i]]}` });
  }
}

function renderFabric(m) {
  const nic = m.fabric.find(f => f.kind === "nic"), link = m.fabric.find(f => f.kind === "link");
  drawCodes($("nicmap"), nic.codes, "nic");
  drawCodes($("linkmap"), link.codes, "link");
  const sum = f => STATES.filter(s => s !== "healthy" && f.states[s]).map(s => `${f.states[s]} ${s.replace("_", " ")}`).join(", ") || "all healthy";
  $("fabricsum").textContent = `NICs: ${sum(nic)} · links: ${sum(link)}` + (nic.codes == null ? " (too many to draw; listed below)" : "");
  // Many paths: show the count and only the paths that are not healthy.
  const shown = m.storage.length > 48 ? m.storage.filter(e => e.state !== "healthy") : m.storage;
  const hiddenNote = shown.length < m.storage.length ? `<span class="muted small">${m.storage.length - shown.length} of ${m.storage.length} paths healthy (not listed)</span>` : "";
  $("storage").innerHTML = hiddenNote + shown.map(e => `<span class="st" data-kind="storage" data-name="${esc(e.name)}" style="background:${e.state === "healthy" ? "#223" : COLOR[e.state]};color:${e.state === "healthy" ? "#aab" : "#0e1217"}" title="${esc(e.name)}: ${e.state}, GFS ${e.gfs}">${esc(e.name)}</span>`).join("");
  const bad = [...nic.not_healthy, ...link.not_healthy];
  $("fabricbad").innerHTML = bad.length ? bad.map(e => `<span class="st" data-kind="${e.kind}" data-name="${esc(e.name)}" style="border-color:${COLOR[e.state]}">${esc(e.name)} · ${e.state}</span>`).join("") : "";
}

// ---- timeline --------------------------------------------------------------------------------------
function renderTimeline(events, s) {
  st.events = events; st.eventsSummary = s;
  const only = $("actionsonly").checked;
  $("timeline").innerHTML = events.filter(e => !only || e.type === "action").map(e => {
    const color = e.type === "action" ? (e.status === "failed" ? COLOR.harmful : "#4aa3ff") : COLOR[e.state] || "#888";
    const kind = e.type === "action" ? "action" : e.kind;
    const ek = e.type === "action" ? "" : e.kind;
    return `<li class="${e.type}" data-kind="${esc(ek)}" data-name="${esc(e.entity)}"><span class="t">${fmtT(e.t_s)}</span><span class="dot" style="background:${color}"></span><span class="kind">${esc(kind)}</span><span class="what">${e.type === "transition" ? "<b>" + esc(e.entity) + "</b> " : ""}${esc(e.text)}</span></li>`;
  }).join("") || `<li class="muted">No transitions or actions yet.</li>`;
  const svg = $("timestrip"), w = svg.clientWidth || 600, t1 = Math.max(s.t_s, 1);
  const x = t => 4 + (w - 8) * t / t1;
  let out = `<line x1="4" y1="17" x2="${w - 4}" y2="17" stroke="#2a343f"/>`;
  for (const e of events) {
    const c = e.type === "action" ? "#4aa3ff" : COLOR[e.state] || "#888";
    out += e.type === "action" ? `<rect x="${x(e.t_s) - 2}" y="5" width="4" height="10" fill="${c}"><title>${esc(e.text)}</title></rect>`
      : `<circle cx="${x(e.t_s)}" cy="24" r="3" fill="${c}"><title>${esc(e.entity + " " + e.text)}</title></circle>`;
  }
  out += `<text x="4" y="33" fill="#8995a3" font-size="10">0</text><text x="${w - 4}" y="33" fill="#8995a3" font-size="10" text-anchor="end">${fmtT(t1)}</text>`;
  svg.innerHTML = out;
}

// ---- throughput ----------------------------------------------------------------------------------
function renderThroughput(tp) {
  const svg = $("tput"), w = svg.clientWidth || 400, h = 150, pad = 36;
  const pts = tp.series;
  if (!pts.length) { svg.innerHTML = `<text x="10" y="20" fill="#8995a3">no throughput data from this source</text>`; }
  else {
    const t0 = pts[0].t_s, t1 = Math.max(pts[pts.length - 1].t_s, t0 + 1);
    let lo = 1; for (const p of pts) { lo = Math.min(lo, p.with_control, p.without_control ?? 1); }
    lo = Math.max(0, Math.floor(lo * 10) / 10 - 0.05);
    const X = t => pad + (w - pad - 6) * (t - t0) / (t1 - t0), Y = v => 6 + (h - 24) * (1 - (v - lo) / (1 - lo));
    const line = key => pts.filter(p => p[key] != null).map(p => `${X(p.t_s).toFixed(1)},${Y(p[key]).toFixed(1)}`).join(" ");
    let g = "";
    for (const v of [lo, (lo + 1) / 2, 1]) g += `<line x1="${pad}" x2="${w - 6}" y1="${Y(v)}" y2="${Y(v)}" stroke="#242d37"/><text x="${pad - 4}" y="${Y(v) + 3}" fill="#8995a3" font-size="10" text-anchor="end">${Math.round(v * 100)}%</text>`;
    g += `<polyline points="${line("without_control")}" fill="none" stroke="#e5383b" stroke-width="1.5" stroke-dasharray="4 3"/>`;
    g += `<polyline points="${line("with_control")}" fill="none" stroke="#4aa3ff" stroke-width="2"/>`;
    g += `<text x="${pad}" y="${h - 4}" fill="#8995a3" font-size="10">${fmtT(t0)}</text><text x="${w - 6}" y="${h - 4}" fill="#8995a3" font-size="10" text-anchor="end">${fmtT(t1)}</text>`;
    g += `<text x="${w - 8}" y="16" fill="#4aa3ff" font-size="11" text-anchor="end">with seamguard</text><text x="${w - 8}" y="30" fill="#e5383b" font-size="11" text-anchor="end">without (counterfactual)</text>`;
    svg.innerHTML = g;
  }
  const d = tp.useful_with_control != null && tp.useful_without_control != null ? tp.useful_with_control - tp.useful_without_control : null;
  $("tputstats").innerHTML = [
    ["useful throughput with control", `<b>${pct(tp.useful_with_control)}</b>`],
    ["without control", `<b>${pct(tp.useful_without_control)}</b>${d != null ? ` (${d >= 0 ? "+" : ""}${(100 * d).toFixed(1)} pts)` : ""}`],
    ["GPU-hours saved so far", `<b>${num(tp.gpu_hours_saved)}</b>`],
    ["job failures with / without", `<b>${tp.job_failures_with_control ?? "—"} / ${tp.job_failures_without_control ?? "—"}</b>`],
    ["failure amplification contained", `<b>${num(tp.fae_contained_gpu_h_per_h)}</b> GPU-h/h`],
    ["amplification still in effect", `<b>${num(tp.fae_in_effect_gpu_h_per_h)}</b> GPU-h/h`],
  ].map(([k, v]) => `<div class="muted">${k}</div><div>${v}</div>`).join("");
}

// ---- jobs and gray entities -------------------------------------------------------------------------
function renderJobs(jobs) {
  $("jobs").innerHTML = `<tr><th>job</th><th class="num">GPUs</th><th>state</th><th class="num" title="non-healthy nodes / nodes">exp.</th><th class="num">useful</th><th class="num" title="without control (counterfactual)">w/o</th></tr>` +
    jobs.map(j => {
      const exposed = j.nodes - (j.exposure.healthy || 0);
      return `<tr class="click" data-kind="job" data-name="${esc(j.name)}" title="crit ${j.criticality}; exposed to ${esc(j.exposed_to.join(", ") || "nothing")}"><td>${esc(j.name.split("-").slice(0, 2).join("-"))}<div class="muted small">${esc(j.job_class.replace(/_/g, " "))} · crit ${j.criticality}</div></td><td class="num">${j.gpus}</td><td>${stateBadge(j.state)}</td><td class="num">${exposed}/${j.nodes}</td><td class="num">${pct(j.useful_throughput)}</td><td class="num muted">${pct(j.useful_throughput_without_control)}</td></tr>`;
    }).join("");
}

async function refreshGray() {
  const bad = STATES.slice(1).map(s => "state=" + s).join("&");
  const [g, n, o] = await Promise.all([
    api(`${API}/entities?kind=gpu&${bad}&sort=gfs&limit=12`),
    api(`${API}/entities?kind=node&${bad}&sort=fae&limit=8`),
    api(`${API}/entities?kind=cooling_loop&${bad}&sort=gfs&limit=5`)]);
  const rows = [...o.items, ...n.items, ...g.items];
  $("graycount").textContent = `${o.total} loops · ${n.total} nodes · ${g.total} GPUs not healthy`;
  $("gray").innerHTML = `<tr><th>entity</th><th>state</th><th class="num">GFS</th><th class="num">FAE</th></tr>` + rows.map(e =>
    `<tr class="click" data-kind="${e.kind}" data-name="${esc(e.name)}"><td>${esc(e.name)} <span class="muted">${e.kind}</span>${e.pinned ? " 📌" : ""}</td><td>${stateBadge(e.state)}</td><td class="num">${e.gfs.toFixed(2)}</td><td class="num">${num(e.fae)}</td></tr>`).join("");
}

// ---- entity detail ------------------------------------------------------------------------------------
function sparkline(sig) {
  const vals = sig.values, n = vals.length;
  const last = [...vals].reverse().find(v => v != null);
  const ok = vals.filter(v => v != null);
  if (!ok.length) return `<div class="lbl">${esc(sig.name)}</div><div class="muted">no data</div>`;
  let lo = Math.min(...ok), hi = Math.max(...ok); if (hi - lo < 1e-9) { hi += 1; lo -= 1; }
  const X = i => 1 + 148 * i / Math.max(n - 1, 1), Y = v => 24 - 22 * (v - lo) / (hi - lo);
  let d = "", pen = false;
  vals.forEach((v, i) => { if (v == null) { pen = false; return; } d += (pen ? "L" : "M") + X(i).toFixed(1) + " " + Y(v).toFixed(1); pen = true; });
  return `<div class="lbl" title="${esc(sig.help)}">${esc(sig.name.replace(/^DCGM_FI_DEV_|^node_infiniband_|^seamguard_/, ""))} <b>${num(last, 4)}</b> <span class="muted">${esc(sig.unit)}</span></div><svg viewBox="0 0 150 26"><path d="${d}" fill="none" stroke="#4aa3ff" stroke-width="1.3"/></svg>`;
}

function scoreBox(label, v, max, hint) {
  const w = Math.max(0, Math.min(1, v / max)) * 100;
  return `<div class="score" title="${esc(hint)}"><span>${label}</span><b>${num(v)}</b><div class="bar"><div style="width:${w}%"></div></div></div>`;
}

function renderDetail(d) {
  const e = d.entity;
  const parents = Object.entries(d.parents).map(([k, v]) => `<span class="muted">${k}</span> <a class="ent" data-kind="${k === "leaf" || k === "spine" ? "" : k}" data-name="${esc(v)}">${esc(v)}</a>`).join(" · ");
  const ev = d.evidence.length ? `<table class="tbl"><tr><th>evidence</th><th class="num">value</th><th>score</th></tr>` + d.evidence.map(r =>
    `<tr><td>${esc(r.channel)}</td><td class="num">${num(r.value, 4)} <span class="muted">${esc(r.unit)}</span></td><td style="width:90px"><div class="bar"><div style="width:${Math.round(r.score * 100)}%;background:${r.score >= .8 ? COLOR.harmful : r.score >= .5 ? COLOR.degraded : "#4aa3ff"}"></div></div></td></tr>`).join("") + "</table>" : `<div class="muted small">no evidence above the noise floor</div>`;
  const kids = d.children.map(c => `${c.kind}s: ` + STATES.filter(s => c.states[s]).map(s => `${c.states[s]} ${s.replace("_", " ")}`).join(", ")).join(" · ");
  const hist = d.history.slice(0, 12).map(t => `<tr><td class="muted">${fmtT(t.t_s)}</td><td>${esc(t.from_state)} → ${stateBadge(t.to_state)}</td><td class="small">${esc(t.reasons.slice(0, 2).map(r => r.channel).join(", "))}</td></tr>`).join("");
  const acts = d.actions.slice(0, 10).map(a => `<tr><td class="muted">${fmtT(a.t_s)}</td><td>${esc(a.op)} <b>${esc(a.verb)}</b> ${esc(a.target)} <span class="muted">[${esc(a.status)}]</span></td><td class="small">${esc(a.reason)}</td></tr>`).join("");
  const decs = d.decisions.filter(x => x.event === "held_by_breaker").slice(0, 3).map(x => `<div class="small" style="color:${COLOR.quarantine}">held by breaker at ${fmtT(x.t_s)}: ${esc(x.verb)} ${esc(x.target)}</div>`).join("");
  const pinnable = ["cooling_loop", "rack", "gpu", "nic", "link", "storage"].includes(e.kind);
  const pin = !pinnable ? "" : d.pin ? `<div class="pinform"><span>📌 pinned <b>${esc(d.pin.state)}</b> by ${esc(d.pin.by)}: ${esc(d.pin.note)}</span><button id="unpin">Unpin</button></div>`
    : `<div class="pinform"><select id="pinstate">${STATES.map(s => `<option value="${s}">${s}</option>`).join("")}</select><input id="pinnote" placeholder="note (why)" maxlength="500"><button id="pinbtn">Pin state</button></div>`;
  $("detail").className = "detail";
  $("detail").innerHTML = `
    <h3>${esc(e.name)} <span class="muted small">${esc(e.kind)}</span> ${stateBadge(e.state)} ${e.pinned ? "📌" : ""}</h3>
    <div class="small">${parents}</div>
    <div class="scores">${scoreBox("GFS", e.gfs, 1, "gray-failure score")}${scoreBox("PRS", e.prs, 1, "propagation risk")}${scoreBox("FAE GPU-h/h", e.fae, Math.max(1, e.fae), "failure amplification estimate")}</div>
    <div class="why" id="why">${esc(d.why)}</div>
    ${decs}
    ${ev}
    ${kids ? `<div class="small muted" style="margin-top:6px">${esc(kids)}</div>` : ""}
    ${d.signals.length ? `<div class="sub">signals (last ${d.signals[0].values.length} ticks)</div><div class="spark">${d.signals.map(sparkline).join("")}</div>` : ""}
    <div class="sub">state history</div>${hist ? `<table class="tbl">${hist}</table>` : `<div class="muted small">no transitions recorded</div>`}
    <div class="sub">actions</div>${acts ? `<table class="tbl" id="entityactions">${acts}</table>` : `<div class="muted small">no actions on it or its node</div>`}
    ${pin}`;
  const pb = $("pinbtn"), ub = $("unpin");
  if (pb) pb.onclick = () => authed("PUT", `${API}/pins/${e.kind}/${e.name}`, { state: $("pinstate").value, note: $("pinnote").value || "pinned from the dashboard" }).then(() => refreshDetail()).catch(showErr);
  if (ub) ub.onclick = () => authed("DELETE", `${API}/pins/${e.kind}/${e.name}`).then(() => refreshDetail()).catch(showErr);
}

function select(kind, name) {
  if (!kind || !name) return;
  if (kind === "cooling_loop" && st.map && st.map.aggregated) { st.loop = name; refreshMap().catch(showErr); }
  st.selected = { kind, name };
  refreshDetail().catch(showErr);
  drawMap();
}

async function refreshDetail() {
  if (!st.selected) return;
  const { kind, name } = st.selected;
  const d = await api(`${API}/entities/${kind}/${name.split("/").map(encodeURIComponent).join("/")}?points=120&history=30`);
  renderDetail(d);
}

// ---- polling ---------------------------------------------------------------------------------------
async function refreshMap() {
  st.map = await api(`${API}/map` + (st.loop ? `?loop=${encodeURIComponent(st.loop)}` : ""));
  drawMap(); renderFabric(st.map);
}

async function refreshAll(s) {
  const [tl, tp, jobs] = await Promise.all([api(`${API}/timeline?limit=150`), api(`${API}/throughput`), api(`${API}/jobs`)]);
  await refreshMap();
  renderTimeline(tl, s); renderThroughput(tp); renderJobs(jobs);
  await Promise.all([refreshGray(), refreshDetail()]);
}

function showErr(e) { if (e && e.message !== "no token") banner("error: " + e.message); }

async function poll() {
  if (st.busy) return;
  st.busy = true;
  try {
    const s = await api(`${API}/summary`);
    st.summary = s; renderHeader(s);
    if (s.tick !== st.tick) { st.tick = s.tick; await refreshAll(s); }
    document.body.dataset.tick = String(s.tick);
  } catch (e) { showErr(e); }
  finally { st.busy = false; }
}

// ---- wiring ---------------------------------------------------------------------------------------
document.addEventListener("click", ev => {
  const t = ev.target.closest("[data-name]");
  if (t && t.dataset.kind) { select(t.dataset.kind, t.dataset.name); return; }
  const c = ev.target.closest("[data-loop]");
  if (c) { st.loop = c.dataset.loop || null; refreshMap().catch(showErr); }
});
$("token").value = localStorage.getItem("seamguard.token") || "";
$("token").addEventListener("change", () => localStorage.setItem("seamguard.token", $("token").value.trim()));
$("mode").onclick = () => { const next = st.summary && st.summary.mode === "enforce" ? "dry_run" : "enforce"; authed("PUT", `${API}/mode`, { mode: next }).then(poll).catch(showErr); };
$("breaker").onclick = () => { if (st.summary && st.summary.breaker.tripped) authed("POST", `${API}/breaker/reset`).then(poll).catch(showErr); };
bindCanvas($("fleetmap"), () => st.rects);
$("actionsonly").addEventListener("change", () => st.events && renderTimeline(st.events, st.eventsSummary));
bindCanvas($("nicmap"), () => st.fabricRects.nic);
bindCanvas($("linkmap"), () => st.fabricRects.link);
window.addEventListener("resize", () => { drawMap(); if (st.map) renderFabric(st.map); });
legend();

// For tests and operators' scripts: where a named GPU is drawn, and what colour it has.
window.seamguard = {
  cellCenter(name) {
    const r = st.rects.find(x => x.kind === "gpu" && x.name === name); if (!r) return null;
    const b = $("fleetmap").getBoundingClientRect();
    return { x: b.left + r.x + r.w / 2, y: b.top + r.y + r.h / 2, cx: r.x + r.w / 2, cy: r.y + r.h / 2 };
  },
  colors: COLOR, states: STATES, get tick() { return st.tick; },
};
poll();
setInterval(poll, POLL_MS);
