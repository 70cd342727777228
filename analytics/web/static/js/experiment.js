// The experiment page: verdicts, SRM banner, allocation, forest plot, lift over time,
// the metrics table, the rollout timeline and evidence, and the shadow paired comparison.
// Everything is drawn from one report (GET /api/experiments/{ref}/report) and, for
// rollouts, the rollout state (GET /api/experiments/{ref}/rollout).

import { ForestChart, LiftOverTimeChart, tone } from "./charts.js";
import { cell, DASH, esc, key, when } from "./format.js";
import { renderPaired } from "./paired.js";
import { drawRiskCharts, renderRisks } from "./rl_risks.js";
import { renderLook, renderRollout } from "./rollout.js";
import { badge, statusBadge } from "./verdicts.js";

const SKELETON = `
  <section class="card head" id="head"></section>
  <div class="banner" id="srm-banner" role="status"></div>
  <div class="row">
    <section class="card" id="verdicts-card"><h2>Verdict</h2><div id="verdicts"></div></section>
    <section class="card narrow" id="allocation-card"><h2>Allocation</h2>
      <table class="grid compact" id="allocation"><thead><tr>
        <th>variant</th><th class="r">weight</th><th class="r">units</th><th class="r">observed</th>
      </tr></thead><tbody></tbody></table>
      <div id="stage-srm"></div>
    </section>
  </div>
  <section class="card" id="paired-card" hidden><h2>Shadow: candidate vs baseline on the same prompts</h2><div id="paired"></div></section>
  <section class="card" id="rollout-look-card" hidden><h2>Rollout evidence</h2><div id="rollout-look"></div></section>
  <section class="card" id="rollout-card" hidden><h2>Rollout decisions</h2><div id="rollout"></div></section>
  <div class="toolbar">
    <label>Segment <select id="segment"><option value="">all units</option></select></label>
    <span class="hint" id="segment-hint"></span>
  </div>
  <div class="row charts">
    <section class="card" id="forest-card">
      <h2>Relative lift by metric <span class="hint">hover for corrected p-values</span></h2>
      <div class="chartbox"><canvas id="forest" aria-label="forest plot of relative lift"></canvas></div>
      <div class="legend">
        <span><i class="sw good"></i>significantly better</span>
        <span><i class="sw bad"></i>significantly worse / guardrail failed</span>
        <span><i class="sw neutral"></i>inconclusive</span>
        <span><i class="sw wide"></i>sequential CI</span>
        <span><i class="sw thin"></i>fixed-horizon CI</span>
        <span><i class="sw dia"></i>estimate</span>
        <span><i class="sw margin"></i>guardrail margin</span>
      </div>
    </section>
    <section class="card" id="timeseries-card">
      <h2>Cumulative lift over time</h2>
      <div class="controls">
        <select id="ts-metric" aria-label="metric"></select>
        <select id="ts-variant" aria-label="candidate"></select>
      </div>
      <div class="chartbox ts"><canvas id="timeseries" aria-label="cumulative lift over time"></canvas></div>
      <p class="empty" id="ts-empty" hidden>No lift to show yet: the series grows with every report snapshot once both variants have data.</p>
    </section>
  </div>
  <section class="card" id="results-card">
    <h2>Metrics</h2>
    <table class="grid" id="results"><thead><tr>
      <th>metric</th><th class="r">units</th><th class="r">control</th><th class="r">candidate</th><th class="r">lift</th>
      <th class="r" title="always-valid interval: may be read at every look">sequential CI</th>
      <th class="r" title="fixed-horizon p-value of this metric alone: valid only once, at the planned sample size">p (fixed)</th>
      <th class="r" title="p (fixed) corrected with Holm for the number of metrics tested">p Holm</th>
      <th class="r" title="always-valid (sequential) p-value, Holm-corrected: what the default verdict policy uses while data accrues">seq. p Holm</th>
      <th class="r">P(beat control)</th><th>guardrail</th><th>progress to sample size</th>
    </tr></thead><tbody></tbody></table>
    <p class="muted caption" id="results-method">Each metric's tag names its method (hover for the p-value and CI conventions); sequential CIs and p-values are always-valid (valid at every look), "p (fixed)" assumes one planned look.</p>
    <dl class="pnotes" id="p-notes">
      <dt>p (fixed)</dt><dd>one metric's fixed-horizon test; valid at the planned sample size, not when peeked at repeatedly.</dd>
      <dt>p Holm</dt><dd>p (fixed) corrected for testing many metrics at once (Holm).</dd>
      <dt>seq. p Holm</dt><dd>always-valid sequential p, Holm-corrected: safe to read at any time; what the default verdict policy (<code>sequential_holm</code>) uses.</dd>
    </dl>
  </section>
  <section class="card" id="risks-card" hidden><h2>RL risks</h2><div id="risks"></div></section>
  <section class="card notes" id="notes-card" hidden><h2>Notes</h2><ul id="notes"></ul></section>`;

export class ExperimentPage {
  constructor(root, ref) {
    this.root = root;
    this.ref = ref;
    this.report = null;
    root.innerHTML = SKELETON;
    this.forest = new ForestChart(root.querySelector("#forest"));
    this.lift = new LiftOverTimeChart(root.querySelector("#timeseries"));
    for (const id of ["#segment", "#ts-metric", "#ts-variant"]) {
      root.querySelector(id).addEventListener("change", () => this.render());
    }
  }

  async refresh(api) {
    const report = await api.report(this.ref);
    // The rollout state is its own endpoint; a failure there must not hide the report.
    let rollout = null;
    if (report.mode === "rollout") {
      try {
        rollout = await api.rollout(this.ref);
      } catch (err) {
        rollout = { error: err.message };
      }
    }
    this.report = report;
    this.rollout = rollout;
    this.render();
  }

  render() {
    const r = this.report;
    if (!r) return;
    document.title = `liftgate — ${r.name}`;
    const $ = (sel) => this.root.querySelector(sel);
    const metrics = new Map(r.metrics.map((m) => [m.name, m]));
    $("#head").innerHTML = head(r);
    srmBanner($("#srm-banner"), r.srm);
    $("#verdicts").innerHTML = verdicts(r);
    $("#allocation tbody").innerHTML = allocation(r.allocation);
    $("#stage-srm").innerHTML = stageSrm(r.srm);

    // A shadow candidate serves no unit: its evidence is the paired comparison alone.
    const shadow = r.mode === "shadow";
    for (const sel of [".toolbar", ".row.charts", "#results-card"]) $(sel).hidden = shadow;
    const view = this.segmentView(r);
    const rows = forestRows(view.results, view.base, metrics, r.control);
    this.forest.update(rows);
    $("#results tbody").innerHTML = resultRows(view.results, view.base, metrics, r.control, examplesLink(r, view.segment));

    this.renderTimeseries(r, metrics);
    const rolloutCard = $("#rollout-card");
    rolloutCard.hidden = r.mode !== "rollout";
    if (r.mode === "rollout") $("#rollout").innerHTML = keepOpen($("#rollout"), () => renderRollout(this.rollout));
    $("#rollout-look-card").hidden = !r.rollout;
    if (r.rollout) $("#rollout-look").innerHTML = renderLook(r.rollout);
    const pairedCard = $("#paired-card");
    pairedCard.hidden = !(r.mode === "shadow" || r.paired.length);
    if (!pairedCard.hidden) $("#paired").innerHTML = renderPaired(r.paired);
    const risks = r.rl_risks || [];
    $("#risks-card").hidden = r.mode === "shadow";
    if (!$("#risks-card").hidden) {
      $("#risks").innerHTML = renderRisks(risks);
      drawRiskCharts($("#risks"), risks);
    }
    const notes = r.errors.map((e) => `<li><code>${esc(e.code)}</code> ${esc(e.message)}</li>`);
    $("#notes-card").hidden = notes.length === 0;
    $("#notes").innerHTML = notes.join("");
  }

  segmentView(r) {
    const select = this.root.querySelector("#segment");
    const wanted = ["", ...r.segments.map((s) => s.segment)];
    const have = [...select.options].map((o) => o.value);
    if (wanted.join("\n") !== have.join("\n")) {
      const current = select.value;
      select.innerHTML =
        `<option value="">all units</option>` +
        r.segments.map((s) => `<option value="${esc(s.segment)}">${esc(s.segment)} (${s.units} units)</option>`).join("");
      select.value = wanted.includes(current) ? current : "";
    }
    select.disabled = r.segments.length === 0;
    const k = r.segments.findIndex((s) => s.segment === select.value);
    this.root.querySelector("#segment-hint").textContent =
      r.segments.length === 0
        ? "no tag breakdowns in this report"
        : k >= 0
          ? "p-values corrected across metrics × candidates × segments"
          : `${r.segments.length} segments available`;
    return k >= 0
      ? { results: r.segments[k].results, base: `/segments/${k}/results`, segment: r.segments[k].segment }
      : { results: r.results, base: "/results", segment: null };
  }

  renderTimeseries(r, metrics) {
    const $ = (sel) => this.root.querySelector(sel);
    const mSel = $("#ts-metric");
    const vSel = $("#ts-variant");
    const names = [...new Set(r.timeseries.map((s) => s.metric))];
    const variants = [...new Set(r.timeseries.map((s) => s.variant))];
    syncOptions(mSel, names.map((n) => [n, (metrics.get(n) || { label: n }).label]));
    syncOptions(vSel, variants.map((v) => [v, v]));
    vSel.hidden = variants.length < 2;
    const series = r.timeseries.find((s) => s.metric === mSel.value && s.variant === vSel.value);
    const points = series ? series.points : [];
    $("#ts-empty").hidden = points.some((pt) => pt.lift_relative != null);
    this.lift.update(points);
  }
}

function syncOptions(select, pairs) {
  const have = [...select.options].map((o) => o.value).join("\n");
  if (have === pairs.map(([v]) => v).join("\n")) return;
  const current = select.value;
  select.innerHTML = pairs.map(([v, label]) => `<option value="${esc(v)}">${esc(label)}</option>`).join("");
  if (pairs.some(([v]) => v === current)) select.value = current;
}

function head(r) {
  // The stage as the candidate's share (what the plan and the rollout card say), not its index.
  const pct = r.rollout?.stage_percent;
  const stage = r.stage == null ? "" : pct == null ? "" : `<span>stage <b>${cell(pct, "num", "/rollout/stage_percent")}%</b></span>`;
  return `
    <div class="title">
      <h1>${esc(r.name)}</h1>
      ${statusBadge(r.status)}
      ${r.verdicts.map((v) => badge(v.verdict, r.verdicts.length > 1 ? ` · ${esc(v.variant)}` : "")).join(" ")}
      ${r.verdicts.some((v) => (v.differences || []).length)
        ? `<span class="pill warn" id="differs" title="the cumulative table differs from the evidence the verdict rests on: see the verdict">cumulative table differs</span>`
        : ""}
    </div>
    <div class="facts">
      <span>route <code>${esc(r.route)}</code></span>
      <span>mode <b>${esc(r.mode)}</b></span>
      ${stage}
      <span>control <b>${esc(r.control || DASH)}</b></span>
      <span>${cell(r.units, "count", "/units")} units</span>
      <span>α = ${cell(r.alpha, "p", "/alpha")}</span>
      <span>started ${when(r.started_at)}</span>
      <span class="muted" id="generated" data-generated="${esc(r.generated_at)}">report ${when(r.generated_at)}</span>
      <a id="offline-gate-link" href="/dashboard/experiments/${encodeURIComponent(r.name)}/offline-gate">offline gate →</a>
      <a id="examples-link" href="/dashboard/experiments/${encodeURIComponent(r.name)}/examples">examples →</a>
      ${r.mode === "shadow" ? `<a id="shadow-pairs-link" href="/dashboard/experiments/${encodeURIComponent(r.name)}/shadow-pairs">shadow pairs →</a>` : ""}
    </div>`;
}

function srmBanner(el, srm) {
  const perStage = srm.method === "per_stage";
  if (srm.flagged) {
    const bad = (srm.stages || []).filter((s) => s.flagged).map((s) => `${s.percent ?? "?"}% (stage ${s.stage})`);
    el.className = "banner bad";
    el.innerHTML = `<b>Sample ratio mismatch${bad.length ? ` in stage ${esc(bad.join(", "))}` : ""}.</b> The observed split
      differs from the ${perStage ? "stage's" : "configured"} weights (p = ${cell(srm.p_value, "p", "/srm/p_value")}, threshold
      ${cell(srm.threshold, "p", "/srm/threshold")}). Find the assignment or logging bug before trusting any result below.`;
  } else if (srm.error) {
    el.className = "banner neutral";
    el.innerHTML = `Sample-ratio check not available: ${esc(srm.error.message)}`;
  } else if (perStage) {
    el.className = "banner ok";
    el.innerHTML = `Every stage's split matches that stage's weights (per-stage SRM over ${(srm.stages || []).length} stage(s),
      combined p = ${cell(srm.p_value, "p", "/srm/p_value")}).`;
  } else if (srm.method === "first_exposure") {
    el.className = "banner ok";
    el.innerHTML = `Units first seen in the current stage match its weights (SRM χ² = ${cell(srm.chi2, "num", "/srm/chi2")},
      p = ${cell(srm.p_value, "p", "/srm/p_value")}; calls carry no stage tag, so earlier stages are not checked).`;
  } else {
    el.className = "banner ok";
    el.innerHTML = `Allocation matches the configured weights (SRM χ² = ${cell(srm.chi2, "num", "/srm/chi2")},
      p = ${cell(srm.p_value, "p", "/srm/p_value")}).`;
  }
  el.dataset.flagged = String(Boolean(srm.flagged));
  el.dataset.method = srm.method || "";
}

// Rollouts: each stage's units against that stage's weights (the banner's evidence).
function stageSrm(srm) {
  const stages = srm.stages || [];
  if (!stages.length) return "";
  const names = [...new Set(stages.flatMap((s) => Object.keys(s.expected_share).concat(Object.keys(s.units))))];
  const rows = stages
    .map((s, i) => {
      const ptr = `/srm/stages/${i}`;
      const units = names
        .map((n) => `<td class="r">${n in s.units ? cell(s.units[n], "count", `${ptr}/units/${key(n)}`) : DASH}</td>`)
        .join("");
      return `<tr data-stage-srm="${s.stage}" class="${s.flagged ? "tone-bad" : ""}"${s.error ? ` title="${esc(s.error.message)}"` : ""}>
        <td>${s.percent == null ? `stage ${s.stage}` : `${cell(s.percent, "num", `${ptr}/percent`)}%`}</td>${units}
        <td class="r">${cell(s.p_value, "p", `${ptr}/p_value`)}</td></tr>`;
    })
    .join("");
  return `<table class="grid compact" id="srm-stages"><thead><tr><th title="candidate weight in the stage">stage</th>
      ${names.map((n) => `<th class="r">${esc(n)}</th>`).join("")}<th class="r">SRM p</th></tr></thead>
      <tbody>${rows}</tbody></table>`;
}

// Redraw a container without closing the <details> a reader opened.
function keepOpen(el, draw) {
  const open = new Set([...el.querySelectorAll("tr[data-evidence-for] details[open]")].map((d) => d.closest("tr").dataset.evidenceFor));
  const had = el.querySelector("tr[data-evidence-for]") !== null;
  const html = draw();
  if (!had) return html;
  const tmp = document.createElement("div");
  tmp.innerHTML = html;
  for (const row of tmp.querySelectorAll("tr[data-evidence-for]")) {
    const d = row.querySelector("details");
    if (d) d.open = open.has(row.dataset.evidenceFor);
  }
  return tmp.innerHTML;
}

function verdicts(r) {
  if (!r.verdicts.length) return `<p class="empty">No candidate to judge yet.</p>`;
  // Metric names → their catalogue labels (the name stays in the tooltip).
  const labels = new Map(r.metrics.map((m) => [m.name, m.label]));
  const named = (x) => `<span title="${esc(x)}">${esc(labels.get(x) || x)}</span>`;
  const list = (label, items, cls) =>
    items.length ? `<div class="${cls}">${label}: ${items.map(named).join(", ")}</div>` : "";
  return r.verdicts
    .map(
      (v) => `<div class="verdict" data-variant="${esc(v.variant)}">
        <div><b>${esc(v.variant)}</b> vs ${esc(r.control || DASH)} ${badge(v.verdict)}</div>
        <div class="reason">${esc(v.reason)}</div>
        ${v.basis ? `<div class="basis" data-basis>on ${esc(v.basis)}</div>` : ""}
        ${list("better", v.better, "good-text")}${list("worse", v.worse, "bad-text")}
        ${list("failed guardrails", v.failed_guardrails, "bad-text")}
        ${(v.differences || []).length
          ? `<ul class="differences" aria-label="where the cumulative table differs">${v.differences
              .map((d) => `<li class="warn-text">${esc(d)}</li>`)
              .join("")}</ul>`
          : ""}
      </div>`,
    )
    .join("");
}

function allocation(rows) {
  return rows
    .map(
      (a, i) => `<tr>
        <td>${esc(a.variant)}${a.is_control ? ' <span class="tag">control</span>' : ""}</td>
        <td class="r">${cell(a.expected_share, "pct", `/allocation/${i}/expected_share`)}</td>
        <td class="r">${cell(a.observed_units, "count", `/allocation/${i}/observed_units`)}</td>
        <td class="r">${cell(a.observed_share, "pct", `/allocation/${i}/observed_share`)}</td>
      </tr>`,
    )
    .join("");
}

function forestRows(results, base, metrics, control) {
  const candidates = [...new Set(results.filter((x) => !x.is_control).map((x) => x.variant))];
  const rows = [];
  results.forEach((res, i) => {
    if (res.is_control || res.variant === control) return;
    const metric = metrics.get(res.metric) || { name: res.metric, label: res.metric, direction: "increase" };
    const label = candidates.length > 1 ? `${metric.label} · ${res.variant}` : metric.label;
    rows.push({ label: metric.guardrail ? `${label} [guardrail]` : label, metric, result: res, ptr: `${base}/${i}` });
  });
  return rows;
}

// "see examples" of a metrics-table row: the requests behind that metric (analytics.report.examples),
// the control's beside the candidate's, in the segment shown.
function examplesLink(r, segment) {
  return (metric, variant) => {
    const q = new URLSearchParams({ metric });
    if (r.control) q.append("variant", r.control);
    q.append("variant", variant);
    if (segment) q.set("segment", segment);
    return `/dashboard/experiments/${encodeURIComponent(r.name)}/examples?${q}`;
  };
}

function resultRows(results, base, metrics, control, link) {
  // One row per metric × candidate, with the control's mean beside the candidate's;
  // metrics in catalogue order.
  const order = [...metrics.keys()];
  const controls = new Map();
  results.forEach((res, i) => {
    if (res.is_control || res.variant === control) controls.set(res.metric, i);
  });
  const idx = results.map((_, i) => i).filter((i) => !(results[i].is_control || results[i].variant === control));
  idx.sort((a, b) => order.indexOf(results[a].metric) - order.indexOf(results[b].metric) || a - b);
  const candidates = new Set(idx.map((i) => results[i].variant));
  return idx
    .map((i) => {
      const res = results[i];
      const m = metrics.get(res.metric) || { label: res.metric, guardrail: false, direction: "increase" };
      const ptr = `${base}/${i}`;
      const c = controls.get(res.metric);
      const controlMean = c == null ? DASH : cell(results[c].mean, "num", `${base}/${c}/mean`);
      const err = res.error ? ` title="${esc(res.error.message)}"` : "";
      const seq = res.sequential_ci_relative
        ? `${cell(res.sequential_ci_relative.lower, "lift", `${ptr}/sequential_ci_relative/lower`)} … ${cell(res.sequential_ci_relative.upper, "lift", `${ptr}/sequential_ci_relative/upper`)}`
        : DASH;
      const variant = candidates.size > 1 ? ` <span class="tag">${esc(res.variant)}</span>` : "";
      const insufficient =
        res.error && res.error.code === "insufficient_data" ? ' <span class="tag" data-insufficient>insufficient data</span>' : "";
      const how = methodTag(res.method);
      const fixed = m.kind === "quantile" ? ' <span class="tag" title="request-level order-statistic interval, valid at one planned look">fixed-horizon</span>' : "";
      return `<tr class="tone-${tone(res)}" data-metric="${esc(res.metric)}" data-variant="${esc(res.variant)}"${err}>
        <td><span title="${esc(m.description || m.name || "")}">${esc(m.label)}</span>${variant}
          ${m.guardrail ? '<span class="tag guard">guardrail</span>' : ""}${fixed}${insufficient}${how}
          <span class="dir" title="${m.direction === "increase" ? "higher" : "lower"} is better">${m.direction === "increase" ? "↑" : "↓"}</span>
          <a class="ex-link" href="${esc(link(res.metric, res.variant))}" title="the requests behind this metric, ${esc(res.variant)} beside ${esc(control || "")}">see examples</a></td>
        <td class="r">${cell(res.units, "count", `${ptr}/units`)}</td>
        <td class="r muted">${controlMean}</td>
        <td class="r">${cell(res.mean, "num", `${ptr}/mean`)}</td>
        <td class="r lift">${cell(res.lift_relative, "lift", `${ptr}/lift_relative`)}</td>
        <td class="r">${seq}</td>
        <td class="r">${cell(res.p_value, "p", `${ptr}/p_value`)}</td>
        <td class="r">${cell(res.p_holm, "p", `${ptr}/p_holm`)}</td>
        <td class="r">${cell(res.p_sequential_holm, "p", `${ptr}/p_sequential_holm`)}</td>
        <td class="r">${cell(res.chance_to_beat_control, "pct", `${ptr}/chance_to_beat_control`)}</td>
        <td>${guardrail(res.guardrail)}</td>
        <td>${progress(res.progress, ptr)}</td>
      </tr>`;
    })
    .join("");
}

// How each number of a row was computed (the report's `method`; docs/statistics.md).
const TEST_TEXT = {
  welch_t: "Welch t test (unpooled variances), Welch t interval",
  pooled_z: "pooled two-proportion z test (= χ²), unpooled Wald z interval",
};

function methodTag(m) {
  if (!m) return "";
  const cuped = m.cuped === "none" ? "no CUPED" : `CUPED θ ${m.cuped.replace("_", " ")}`;
  const title = `p (fixed) and CI: ${TEST_TEXT[m.test] || m.test}; sequential CI and p: always-valid mixture SPRT tuned at ${m.planned_units} units; ${cuped}; Holm and Benjamini–Hochberg corrections; P(beat control): Gaussian posterior`;
  const short = `${m.test === "pooled_z" ? "pooled z" : "Welch t"} · ${m.cuped === "none" ? "raw" : `CUPED ${m.cuped.replace("_", " ")}`}`;
  return ` <span class="tag method" data-test="${esc(m.test)}" data-interval="${esc(m.interval)}" data-cuped="${esc(m.cuped)}" data-sequential="${esc(m.sequential)}" title="${esc(title)}">${esc(short)}</span>`;
}

function guardrail(g) {
  if (!g) return "";
  const margin = `non-inferiority margin ${g.margin_text || (g.scale === "absolute" ? `+${g.margin}` : `${(g.margin * 100).toFixed(1)}%`)}`;
  if (g.error && g.error.code === "not_yet_valid") {
    return `<span class="badge neutral" data-guardrail-outcome="not_yet_valid" title="${esc(g.error.message)}">fixed-horizon, not yet valid</span>`;
  }
  const t = { pass: "good", fail: "bad", inconclusive: "neutral" }[g.outcome];
  const label = g.test === "fixed_horizon" ? `${g.outcome} (fixed-horizon)` : g.outcome;
  const why = g.error ? ` — ${g.error.message}` : "";
  return `<span class="badge ${t}" data-guardrail-outcome="${esc(g.outcome)}" title="${esc(margin + why)}">${esc(label)}</span>`;
}

function progress(pr, ptr) {
  if (!pr) return "";
  if (pr.fraction == null) return `<span class="muted"${pr.error ? ` title="${esc(pr.error.message)}"` : ""}>${DASH}</span>`;
  const w = Math.max(0, Math.min(1, pr.fraction)) * 100;
  return `<div class="progress" title="${pr.units} of ${pr.required ?? "?"} units per variant to detect a ${pr.mde == null ? "?" : (pr.mde * 100).toFixed(1) + "%"} effect">
      <div class="bar"><div style="width:${w.toFixed(1)}%"></div></div>
      ${cell(pr.fraction, "pct", `${ptr}/progress/fraction`)}
    </div>`;
}
