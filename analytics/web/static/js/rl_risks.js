// The "RL risks" panel: report.rl_risks (one entry per candidate; analytics/report/risks_schema.py).
// Alarms, the capability matrix (category × metric, EB-shrunk lifts with Holm p), the category
// mix, the length decomposition, the judge-vs-user chart and the phrase table. Every number is a
// cell() whose pointer resolves in the report (and in /api/experiments/{ref}/rl-risks).

import { TONE } from "./charts.js";
import { cell, DASH, esc } from "./format.js";

const ALARM_LABELS = {
  forgetting: "forgetting (a category got worse)",
  category_guardrail: "per-category guardrail",
  category_mix: "category mix",
  verbosity: "verbosity without gain",
  goodhart: "judge vs users",
  stuffing: "keyword stuffing",
};
const METRIC_LABELS = { thumbs_down_rate: "thumbs-down", thumbs_up_rate: "thumbs-up", satisfaction: "satisfaction" };
const SHOW_UNFLAGGED = 5;
const STATE_LABELS = { insufficient_data: "insufficient data", unavailable: "unavailable", error: "error", ok: "ok" };

export function renderRisks(list) {
  if (!list.length) return `<p class="empty">No RL-risk analysis yet: it needs primary responses from the control and a candidate.</p>`;
  return list.map((r, k) => candidate(r, `/rl_risks/${k}`, k)).join("");
}

function state(part) {
  if (part.state === "ok") return "";
  return ` <span class="tag" data-risk-state="${esc(part.state)}" title="${esc(part.reason || "")}">${esc(STATE_LABELS[part.state] || part.state)}</span>`;
}

function alarms(r) {
  return `<div class="risk-alarms">${r.alarms
    .map((a) => {
      const tone = a.firing ? "bad" : a.state === "ok" ? "good" : "neutral";
      const text = a.firing ? "fires" : a.state === "ok" ? "quiet" : STATE_LABELS[a.state];
      const cats = a.categories.length ? ` · ${esc(a.categories.join(", "))}` : "";
      return `<span class="badge ${tone}" data-alarm="${esc(a.name)}" data-firing="${a.firing}" data-state="${esc(a.state)}"
        title="${esc(a.detail || "")}">${esc(ALARM_LABELS[a.name] || a.name)}: ${esc(text)}${cats}</span>`;
    })
    .join(" ")}</div>`;
}

function matrix(r, base) {
  const cap = r.capability;
  if (!cap.cells.length) return `<p class="empty">No categories yet.${state(cap)}</p>`;
  const index = new Map(cap.cells.map((c, i) => [`${c.category}\u0000${c.metric}`, i]));
  const shares = new Map(r.category_mix.shares.map((s, i) => [s.category, i]));
  const rows = cap.categories
    .map((cat) => {
      const cells = cap.metrics
        .map((m) => {
          const i = index.get(`${cat}\u0000${m}`);
          if (i == null) return `<td class="r">${DASH}</td>`;
          const c = cap.cells[i];
          const ptr = `${base}/capability/cells/${i}`;
          if (c.state !== "ok") {
            return `<td class="r muted" data-cell="${esc(cat)}/${esc(m)}" title="${esc(c.reason || "")}">
              ${cell(c.n_candidate, "count", `${ptr}/n_candidate`)} units${state(c)}</td>`;
          }
          const tone = c.harmed ? "bad-text" : "";
          return `<td class="r ${tone}" data-cell="${esc(cat)}/${esc(m)}" data-harmed="${c.harmed}"
            title="raw lift ${esc(String(c.lift))}; BH q ${esc(String(c.q_value))}">
            ${cell(c.shrunk_lift, "diff", `${ptr}/shrunk_lift`)}
            <span class="muted">p<sub>Holm</sub> ${cell(c.p_holm, "p", `${ptr}/p_holm`)}</span></td>`;
        })
        .join("");
      const s = shares.get(cat);
      const sp = `${base}/category_mix/shares/${s}`;
      const mix = s == null
        ? `<td class="r">${DASH}</td><td class="r">${DASH}</td>`
        : `<td class="r">${cell(r.category_mix.shares[s].control, "pct", `${sp}/control`)}</td>
           <td class="r">${cell(r.category_mix.shares[s].candidate, "pct", `${sp}/candidate`)}</td>`;
      return `<tr data-category="${esc(cat)}"><td>${esc(cat)}</td>${cells}${mix}</tr>`;
    })
    .join("");
  const guards = cap.guardrails.length
    ? `<div class="muted">category guardrails: ${cap.guardrails
        .filter((g) => g.breached)
        .map((g) => `<span class="bad-text">${esc(g.metric)} in ${esc(g.category)} over its margin</span>`)
        .join(", ") || "none breached"}</div>`
    : "";
  const mix = r.category_mix;
  const mixLine = mix.state === "ok"
    ? `category mix p = ${cell(mix.p_value, "p", `${base}/category_mix/p_value`)} (flagged below ${cell(mix.threshold, "p", `${base}/category_mix/threshold`)})`
    : `category mix${state(mix)}`;
  return `<table class="grid compact" id="risk-matrix-${esc(r.variant)}"><thead><tr><th>category</th>
      ${cap.metrics.map((m) => `<th class="r" title="candidate − control, EB-shrunk (display); p: one-sided harm, Holm across categories">${esc(METRIC_LABELS[m] || m)}</th>`).join("")}
      <th class="r">share control</th><th class="r">share candidate</th></tr></thead><tbody>${rows}</tbody></table>
    <div class="muted">${mixLine}${state(cap)}</div>${guards}`;
}

function evidence(ev, ptr) {
  if (!ev) return DASH;
  return `${cell(ev.estimate, "diff", `${ptr}/estimate`)} <span class="muted">[${cell(ev.lower, "diff", `${ptr}/lower`)} … ${cell(ev.upper, "diff", `${ptr}/upper`)}]</span>`;
}

function length(r, base) {
  const v = r.verbosity;
  const ptr = `${base}/verbosity`;
  const d = v.decomposition;
  const dec = d
    ? `<tr><td>total lift in ${esc(v.outcome)}</td><td class="r">${evidence(d.total, `${ptr}/decomposition/total`)}</td></tr>
       <tr><td>explained by length</td><td class="r">${cell(d.explained, "diff", `${ptr}/decomposition/explained`)}</td></tr>
       <tr><td>residual (beyond length)</td><td class="r">${evidence(d.residual, `${ptr}/decomposition/residual`)}</td></tr>`
    : "";
  return `<table class="grid compact" id="risk-length-${esc(r.variant)}"><tbody>
      <tr><td>completion tokens per response</td><td class="r">${cell(v.tokens_control, "num", `${ptr}/tokens_control`)} → ${cell(v.tokens_candidate, "num", `${ptr}/tokens_candidate`)}
        (${cell(v.relative_shift, "lift", `${ptr}/relative_shift`)})${v.longer ? ' <span class="tag">significantly longer</span>' : ""}</td></tr>
      ${dec}</tbody></table>${state(v)}`;
}

function judge(r, base, k) {
  const j = r.judge;
  const ptr = `${base}/judge`;
  const says = j.judge_says == null
    ? ""
    : `<p class="${j.diverged ? "bad-text" : ""}" data-judge-summary>the judge says ${cell(j.judge_says, "diff", `${ptr}/judge_says`)},
        users say ${cell(j.users_say, "diff", `${ptr}/users_say`)}
        <span class="muted">(divergence p = ${cell(j.divergence && j.divergence.p_above, "p", `${ptr}/divergence/p_above`)};
        score–outcome correlation ${cell(j.correlation_control, "num", `${ptr}/correlation_control`)} → ${cell(j.correlation_candidate, "num", `${ptr}/correlation_candidate`)})</span></p>`;
  const chart = j.curve.length ? `<div class="chartbox small"><canvas id="risk-judge-${k}" aria-label="user outcome by judge score"></canvas></div>` : "";
  return `${says}${chart}${state(j)}`;
}

// Content logging "hashed": a phrase is the keyed hash of a 1–3-gram; its text shows only when
// the operator's phrase list (LIFTGATE_NGRAM_PHRASES, or ?phrase= on the API) resolves it.
function phraseText(p) {
  if (!p.hash) return `<code>${esc(p.phrase)}</code>`;
  if (!p.resolved) {
    return `<code class="hash" title="keyed hash of a 1–3-word phrase (content logging hashed)">#${esc(p.hash)}</code>`;
  }
  return `<code>${esc(p.phrase)}</code> <span class="muted" title="resolved by the phrase list">#${esc(p.hash)}</span>`;
}

function phrases(r, base) {
  const ph = r.phrases;
  if (!ph.phrases.length) return `<p class="empty">No over-represented phrase tested yet.${state(ph)}</p>`;
  // Every flagged phrase, then the next few by strength (the report keeps up to 20).
  const shown = ph.phrases.map((p, i) => [p, i]).filter(([p], j) => p.flagged || j < ph.flagged.length + SHOW_UNFLAGGED);
  const rows = shown
    .map(([p, i]) => {
      const ptr = `${base}/phrases/phrases/${i}`;
      return `<tr data-phrase="${esc(p.phrase)}" class="${p.flagged ? "tone-bad" : ""}">
        <td>${phraseText(p)}${p.flagged ? ' <span class="badge bad">flagged</span>' : ""}</td>
        <td class="r">${cell(p.rate_control, "pct", `${ptr}/rate_control`)}</td>
        <td class="r">${cell(p.rate_candidate, "pct", `${ptr}/rate_candidate`)}</td>
        <td class="r">${cell(p.q_value, "p", `${ptr}/q_value`)}</td>
        <td>${esc(p.categories.join(", "))}</td>
        <td class="r">${cell(p.outcome_with, "num", `${ptr}/outcome_with`)} / ${cell(p.outcome_without, "num", `${ptr}/outcome_without`)}</td>
        <td class="r">${cell(p.judge_with, "num", `${ptr}/judge_with`)} / ${cell(p.judge_without, "num", `${ptr}/judge_without`)}</td>
      </tr>`;
    })
    .join("");
  return `<table class="grid compact" id="risk-phrases-${esc(r.variant)}"><thead><tr><th>phrase</th>
      <th class="r">control</th><th class="r">candidate</th><th class="r">BH q</th><th>categories</th>
      <th class="r" title="candidate responses with / without the phrase">${esc(r.outcome)} with / without</th>
      <th class="r" title="candidate responses with / without the phrase">judge with / without</th></tr></thead>
      <tbody>${rows}</tbody></table>
    <div class="muted">${cell(ph.tested, "count", `${base}/phrases/tested`)} phrases tested over
      ${cell(ph.responses_control, "count", `${base}/phrases/responses_control`)} + ${cell(ph.responses_candidate, "count", `${base}/phrases/responses_candidate`)} recent ${ph.source === "hashed" ? "hashed (sampled) " : ""}responses${state(ph)}</div>`;
}

function candidate(r, base, k) {
  return `<div class="risks" data-variant="${esc(r.variant)}">
    <div class="facts"><span><b>${esc(r.variant)}</b> vs <b>${esc(r.control)}</b></span>
      <span>${cell(r.units_control, "count", `${base}/units_control`)} + ${cell(r.units_candidate, "count", `${base}/units_candidate`)} units</span>
      <span class="muted">outcome: ${esc(r.outcome)} = thumbs-up − thumbs-down per response</span></div>
    ${alarms(r)}
    <div class="row">
      <section class="sub"><h3>Capability matrix</h3>${matrix(r, base)}</section>
      <section class="sub narrow"><h3>Length decomposition</h3>${length(r, base)}</section>
    </div>
    <div class="row">
      <section class="sub narrow"><h3>Judge vs users</h3>${judge(r, base, k)}</section>
      <section class="sub"><h3>Phrases the candidate over-uses</h3>${phrases(r, base)}</section>
    </div>
  </div>`;
}

// The judge-vs-user chart: mean user outcome by judge-score bin, control vs candidate. A
// judge that tracks users puts the candidate's points on the control's curve.
export function drawRiskCharts(root, list) {
  list.forEach((r, k) => {
    const canvas = root.querySelector(`#risk-judge-${k}`);
    if (!canvas) return;
    const old = Chart.getChart(canvas);
    if (old) old.destroy();
    const pts = (f, n) => r.judge.curve.filter((c) => c[n] > 0).map((c) => ({ x: (c.low + c.high) / 2, y: c[f] }));
    new Chart(canvas, {
      type: "line",
      data: {
        datasets: [
          { label: "control", data: pts("control_outcome", "control_n"), borderColor: TONE.neutral, backgroundColor: TONE.neutral },
          { label: r.variant, data: pts("candidate_outcome", "candidate_n"), borderColor: TONE.accent, backgroundColor: TONE.accent },
        ],
      },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        scales: {
          x: { type: "linear", title: { display: true, text: "judge score" } },
          y: { title: { display: true, text: `${r.outcome} per response` } },
        },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      },
    });
  });
}
