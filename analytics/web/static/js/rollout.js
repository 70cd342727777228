// Staged rollouts: current stage and the timeline of decisions (stage, time, decision,
// reason) from GET /api/experiments/{ref}/rollout.

import { DASH, esc, when } from "./format.js";

const TONES = { advance: "good", promote: "good", rollback: "bad", rolled_back: "bad", hold: "neutral", pause: "neutral", resume: "accent" };

function decisionsOf(state) {
  if (!state) return [];
  if (Array.isArray(state)) return state;
  return state.decisions || state.timeline || [];
}

function stagesOf(state, report) {
  if (state && Array.isArray(state.stages)) return state.stages;
  if (state && state.plan && Array.isArray(state.plan.stages)) return state.plan.stages;
  return null;
}

function stageLabel(stages, i) {
  if (i == null) return DASH;
  const s = stages && stages[i];
  const pctValue = s == null ? null : typeof s === "number" ? s : s.percent ?? s.weight ?? null;
  return pctValue == null ? `stage ${i}` : `stage ${i} (${pctValue}%)`;
}

export function renderRollout(state, report) {
  if (state && state.error && !Array.isArray(state)) {
    return `<p class="muted">Rollout state unavailable: ${esc(state.error)}</p>`;
  }
  const stages = stagesOf(state, report);
  const current = state && !Array.isArray(state) && state.stage != null ? state.stage : report.stage;
  const ladder = stages
    ? `<ol class="ladder">${stages
        .map((s, i) => `<li class="${i === current ? "current" : i < current ? "done" : ""}">${esc(stageLabel(stages, i).replace(/^stage \d+ /, ""))}</li>`)
        .join("")}</ol>`
    : "";
  const rows = decisionsOf(state)
    .slice()
    .sort((a, b) => Date.parse(b.created_at || b.at || b.t) - Date.parse(a.created_at || a.at || a.t))
    .map((d) => {
      const t = TONES[d.decision] || "neutral";
      const to = d.to_stage != null && d.to_stage !== d.stage ? ` → ${esc(stageLabel(stages, d.to_stage))}` : "";
      return `<tr data-decision="${esc(d.decision)}">
        <td>${when(d.created_at || d.at || d.t)}</td>
        <td>${esc(stageLabel(stages, d.stage))}${to}</td>
        <td><span class="badge ${t}">${esc(d.decision)}</span></td>
        <td>${esc(d.reason || "")}</td>
        <td class="muted">${esc(d.actor || "")}</td>
      </tr>`;
    })
    .join("");
  const status = state && !Array.isArray(state) && state.status ? `<span>status <b>${esc(state.status)}</b></span>` : "";
  return `<div class="facts"><span>current ${esc(stageLabel(stages, current))}</span>${status}
    </div>
    ${ladder}
    <table class="grid compact" id="rollout-timeline"><thead><tr>
      <th>time</th><th>stage</th><th>decision</th><th>reason</th><th>by</th>
    </tr></thead><tbody>${rows || `<tr><td colspan="5" class="muted">No decisions yet.</td></tr>`}</tbody></table>`;
}
