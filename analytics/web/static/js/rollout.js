// Staged rollouts: the stage ladder and the timeline of decisions (time, stage, decision,
// reason, actor) from GET /api/experiments/{ref}/rollout (analytics/rollout/api.py).

import { cell, DASH, esc, when } from "./format.js";

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

function evidenceTitle(evidence) {
  if (!evidence || !Object.keys(evidence).length) return "";
  const text = JSON.stringify(evidence);
  return text.length > 800 ? text.slice(0, 800) + "…" : text;
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
  const rows = (state.decisions || [])
    .slice()
    .sort((a, b) => Date.parse(b.created_at) - Date.parse(a.created_at) || (b.id || 0) - (a.id || 0))
    .map((d) => {
      const to = d.to_stage != null && d.to_stage !== d.stage ? ` → ${esc(stageLabel(stages, d.to_stage))}` : "";
      return `<tr data-decision="${esc(d.decision)}" title="${esc(evidenceTitle(d.evidence))}">
        <td>${when(d.created_at)}</td>
        <td>${esc(stageLabel(stages, d.stage))}${to}</td>
        <td><span class="badge ${TONES[d.decision] || "neutral"}">${esc(d.decision)}</span></td>
        <td>${esc(d.reason || "")}</td>
        <td class="muted">${esc(d.actor || "")}</td>
      </tr>`;
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
    ${ladder}
    <table class="grid compact" id="rollout-timeline"><thead><tr>
      <th>time</th><th>stage</th><th>decision</th><th>reason</th><th>by</th>
    </tr></thead><tbody>${rows || `<tr><td colspan="5" class="muted">No decisions yet.</td></tr>`}</tbody></table>`;
}
