// The What-if panel: the twin calibrated on this fleet's ledger over the chosen range, its faults
// replayed under another controller setting (GET /api/v1/twin/whatif). Asked on demand (the run
// button), never polled: one answer costs seconds of the service's CPU. Uses app.js's helpers.
"use strict";

const WI_VALUES = { mode: "dry_run", breaker: "0.01,0.05,off", breaker_in_effect: "0.1,off", drain_min_slowdown: "0.2,0.4" };
const WI_BUDGET_S = 5;  // inside the dashboard's fetch timeout
const wiQ3 = (x, f) => x == null ? "—" : `${f(x[1])} <span class="muted">[${f(x[0])}, ${f(x[2])}]</span>`;
const wiPt = v => (v > 0 ? "+" : "") + (100 * v).toFixed(2) + " pt";
const wiGpuH = v => (v > 0 ? "+" : "") + Math.round(v).toLocaleString("en-US");
const wiN = v => Math.round(v).toLocaleString("en-US");

async function runWhatIf(ev) {
  if (ev) ev.preventDefault();
  const [t0, t1] = chartWindow();
  const knob = $("wiknob").value, values = $("wivalues").value.trim();
  const qs = new URLSearchParams({ since: Math.max(t0, 0).toFixed(3), until: t1.toFixed(3), whatif: `${knob}=${values}`,
                                   draws: "4", seeds: "3", budget_s: String(WI_BUDGET_S) });
  $("wistatus").textContent = "replaying the range's faults through the twin…";
  $("wirun").disabled = true;
  try {
    renderWhatIf(await authed("GET", `${API}/twin/whatif?${qs}`));  // seconds of the controller's CPU: operators only
  } catch (e) {
    $("wistatus").textContent = "error: " + e.message;
    $("witable").innerHTML = ""; $("wijobs").innerHTML = "";
  } finally {
    $("wirun").disabled = false;
  }
}

function renderWhatIf(d) {
  const w = d.whatif, s = w.samples;
  $("wistatus").innerHTML = `${w.incidents_in_window.hard} hard and ${w.incidents_in_window.gray} gray incidents in the range, `
    + `replayed ${s.done} of ${s.asked} times${s.cut_short ? " (time budget reached)" : ""}; fleet ETTR under the base `
    + `${wiQ3(d.fleet_ettr, pct)}. Median [2.5 %, 97.5 %].`
    + (d.priors_used.length ? ` Published priors for ${esc(d.priors_used.join(", "))}.` : "");
  const head = "<tr><th>variant</th><th>ETTR</th><th>change</th><th>GPU-h bought</th><th>better in</th><th>drained</th><th>held by breaker</th></tr>";
  $("witable").innerHTML = head + w.variants.map(v => {
    const base = v.variant === "base";
    return `<tr data-variant="${esc(v.variant)}"><td title="${esc(JSON.stringify(v.settings))}">${esc(base ? "base (as it runs)" : v.variant)}</td>`
      + `<td>${wiQ3(v.ettr, pct)}</td><td>${base ? "—" : wiQ3(v.delta_ettr, wiPt)}</td>`
      + `<td>${base ? "—" : wiQ3(v.delta_gpu_hours, wiGpuH)}</td><td>${base || v.better_share == null ? "—" : pct(v.better_share)}</td>`
      + `<td>${wiQ3(v.drained_nodes, wiN)}</td><td>${wiQ3(v.held_by_breaker, wiN)}</td></tr>`;
  }).join("");
  $("wijobs").innerHTML = "<tr><th>job</th><th>checkpoint every</th><th>tier</th><th>ETTR</th><th>hot spares</th><th>P(slip)</th></tr>"
    + d.jobs.map(j => `<tr data-job="${esc(j.job)}"><td>${esc(j.job)}</td><td>${wiQ3(j.interval_s, fmtDur)}</td>`
      + `<td>${esc(label(j.tier))}</td><td>${wiQ3(j.ettr, pct)}</td><td>${wiQ3(j.hot_spares, wiN)}</td><td>${wiQ3(j.p_slip, pct)}</td></tr>`).join("");
}

$("wiknob").onchange = () => { $("wivalues").value = WI_VALUES[$("wiknob").value] || ""; };
$("wiform").onsubmit = runWhatIf;
