// Staged rollouts. Two parts, each drawn from the API it shows:
// - the rollout card (GET /api/experiments/{ref}/rollout, analytics/service/rollout_api.py): plan
//   warnings, the stage ladder and the timeline of decisions, each with the evidence the
//   controller acted on;
// - the evidence card (the report's `rollout` section): the plan's guardrails, what the
//   verdict rests on, and the controller's live look at the current stage window.

import { cell, DASH, esc, when } from "./format.js";
import { renderEvidence, summary } from "./evidence.js";

const TONES = {
  start: "accent",
  advance: "good",
  promote: "good",
  rollback: "bad",
  hold: "neutral",
  pause: "neutral",
  resume: "accent",
};

function stageLabel(stages, i) {
  if (i == null) return DASH;
  const s = stages[i];
  return s && s.percent != null ? `${s.percent}%` : `stage ${i}`;
}

// Plan warnings (e.g. a stage too short to detect a margin at the expected traffic): strings
// or objects with a message; shown as they come.
function warnings(list) {
  if (!Array.isArray(list) || !list.length) return "";
  const text = (w) => (typeof w === "string" ? w : w && (w.message || w.reason)) || JSON.stringify(w);
  return `<ul class="warnings" id="plan-warnings">${list
    .map((w) => `<li class="warn-text">${esc(text(w))}</li>`)
    .join("")}</ul>`;
}

// The plan check of GET .../rollout: errors (the controller refuses the plan) before warnings.
function planNotes(state) {
  const pc = state.plan_check || {};
  const errs = (Array.isArray(pc.errors) ? pc.errors : []).map((e) => `error: ${typeof e === "string" ? e : JSON.stringify(e)}`);
  return [...errs, ...(state.warnings || pc.warnings || [])];
}

export function renderRollout(state) {
  if (!state || state.error) {
    return `<p class="muted">Rollout state unavailable${state ? `: ${esc(state.error)}` : ""}.</p>`;
  }
  const stages = state.stages || [];
  const current = state.stage;
  const ladder = stages.length
    ? `<ol class="ladder" aria-label="rollout stages">${stages
        .map((s, i) => {
          const cls = current == null ? "" : i === current ? "current" : i < current ? "done" : "";
          return `<li class="${cls}" data-stage="${i}">${esc(stageLabel(stages, i))}</li>`;
        })
        .join("")}</ol>`
    : "";
  const decisions = (state.decisions || []).map((d, i) => ({ d, i }));
  decisions.sort(
    (a, b) => Date.parse(b.d.created_at) - Date.parse(a.d.created_at) || (b.d.id || 0) - (a.d.id || 0),
  );
  const rows = decisions
    .map(({ d, i }, k) => {
      const to = d.to_stage != null && d.to_stage !== d.stage ? ` → ${esc(stageLabel(stages, d.to_stage))}` : "";
      const ev = d.evidence || {};
      // The newest decision's evidence is open; older ones are a click away.
      return `<tr data-decision="${esc(d.decision)}" data-decision-id="${esc(d.id)}">
        <td>${when(d.created_at)}</td>
        <td>${esc(stageLabel(stages, d.stage))}${to}</td>
        <td><span class="badge ${TONES[d.decision] || "neutral"}">${esc(d.decision)}</span></td>
        <td>${esc(d.reason || "")}</td>
        <td class="muted">${esc(d.actor || "")}</td>
      </tr>
      <tr class="evidence-row" data-evidence-for="${esc(d.id)}"><td></td><td colspan="4">
        <details${k === 0 ? " open" : ""}><summary>evidence ${summary(ev)}</summary>
          ${renderEvidence(ev, `/decisions/${i}/evidence`)}</details>
      </td></tr>`;
    })
    .join("");
  const percent = state.stage_percent == null ? DASH : `${cell(state.stage_percent, "num", "/stage_percent")}%`;
  return `<div class="facts">
      <span>candidate traffic <b>${percent}</b></span>
      <span>status <b>${esc(state.status)}</b></span>
      ${state.stage_started_at ? `<span>stage since ${when(state.stage_started_at)}</span>` : ""}
      ${state.status_reason ? `<span>${esc(state.status_reason)}</span>` : ""}
      ${state.plan_error ? `<span class="bad-text">plan: ${esc(state.plan_error)}</span>` : ""}
    </div>
    ${warnings(planNotes(state))}
    ${ladder}
    <table class="grid compact" id="rollout-timeline"><thead><tr>
      <th>time</th><th>stage</th><th>decision</th><th>reason</th><th>by</th>
    </tr></thead><tbody>${rows || `<tr><td colspan="5" class="muted">No decisions yet.</td></tr>`}</tbody></table>`;
}

// The report's rollout section: what the verdict rests on, with the live look's evidence.
export function renderLook(section) {
  if (!section) return "";
  const guards = section.guardrails.length
    ? section.guardrails
        .map((g, i) => `<span class="kv" data-plan-guardrail="${esc(g.metric)}">${esc(g.metric)} within ${
          g.margin_text ? esc(g.margin_text) : cell(g.margin, "pct", `/rollout/guardrails/${i}/margin`)
        }</span>`)
        .join(" ")
    : `<span class="bad-text">none: the plan tests no guardrail</span>`;
  const look = section.look
    ? `<div class="look" id="live-look">
        <div>Controller's look at ${when(section.look.at)}: its rules say <b>${esc(section.look.decision)}</b> — ${esc(section.look.reason)}</div>
        ${renderEvidence(section.look.evidence, "/rollout/look/evidence")}
      </div>`
    : `<p class="muted">No live look: the rollout is not running a stage.</p>`;
  return `<div class="facts">
      <span>plan guardrails ${guards}</span>
      <span>window <b>${esc(section.window)}</b></span>
      <span>tests need ${cell(section.min_test_units, "count", "/rollout/min_test_units")} units per arm</span>
    </div>
    ${section.error ? `<p class="bad-text">${esc(section.error.message)}</p>` : ""}
    <p class="basis" id="rollout-basis">Verdict rests on: ${esc(section.basis || "no controller evidence")}</p>
    ${look}`;
}
