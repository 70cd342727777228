// The rollout controller's evidence for one look (a decision's `evidence`, or the report's
// live look): guardrails with estimate, bounds, margin and units per arm; the SRM counts;
// the stage's minimums; success metrics; and any key this page does not know, shown as is
// (the controller may record more over time). Every number keeps its JSON pointer, so the
// browser test can check it against the API it came from.

import { cell, DASH, esc, key as seg } from "./format.js";

const OUTCOME_TONE = { harm: "bad", noninferior: "good", inconclusive: "neutral", no_data: "neutral" };
const KNOWN = new Set(["code", "stage_percent", "elapsed_s", "min_duration_s", "min_units", "units", "guardrails", "srm", "success"]);
const GUARD_KNOWN = new Set([
  "metric", "outcome", "margin", "alpha", "direction", "n_control", "n_candidate", "control_mean",
  "candidate_mean", "harm", "lower", "upper", "p_value", "message", "harm_scale", "margin_text",
]);

const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);

// A field of `obj` as a number cell pointing at it; a dash (and no pointer) when absent.
function at(obj, key, fmt, ptr) {
  return isObj(obj) && key in obj ? cell(obj[key], fmt, `${ptr}/${seg(key)}`) : DASH;
}

// A value of unknown meaning: numbers as numbers (with their pointer), the rest as text.
function anyValue(value, ptr) {
  if (typeof value === "number") return cell(value, "num", ptr);
  if (value === null || value === undefined) return DASH;
  if (typeof value === "string" || typeof value === "boolean") return esc(String(value));
  const text = JSON.stringify(value);
  return `<code>${esc(text.length > 300 ? text.slice(0, 300) + "…" : text)}</code>`;
}

function extras(obj, known, ptr) {
  return Object.keys(obj)
    .filter((k) => !known.has(k))
    .map((k) => `<span class="kv" data-key="${esc(k)}">${esc(k.replaceAll("_", " "))} ${anyValue(obj[k], `${ptr}/${seg(k)}`)}</span>`)
    .join(" ");
}

export function outcomeBadge(outcome) {
  return `<span class="badge ${OUTCOME_TONE[outcome] || "neutral"}" data-outcome="${esc(outcome)}">${esc(String(outcome ?? DASH).replaceAll("_", " "))}</span>`;
}

// One line naming what a look found, for a decision's summary.
export function summary(ev) {
  if (!isObj(ev)) return "";
  const parts = [];
  if (Array.isArray(ev.guardrails)) {
    parts.push(
      ev.guardrails.length
        ? ev.guardrails.map((g) => `${esc(g.metric)} ${outcomeBadge(g.outcome)}`).join(" ")
        : `<span class="muted">no guardrails</span>`,
    );
  }
  if (isObj(ev.srm)) parts.push(`SRM ${ev.srm.flagged ? '<span class="bad-text">mismatch</span>' : "ok"}`);
  return parts.join(" · ");
}

function guardrails(list, ptr) {
  if (!Array.isArray(list) || !list.length) return `<p class="muted">No guardrail tested.</p>`;
  const rows = list
    .map((g, j) => {
      const p = `${ptr}/guardrails/${j}`;
      const more = isObj(g) ? extras(g, GUARD_KNOWN, p) : "";
      // Harm, bounds and margin share one scale: relative (a percentage) or absolute
      // (metric units, e.g. +0.01 error rate = one point).
      const abs = g.harm_scale === "absolute";
      const hf = abs ? "num" : "lift";
      const mf = abs ? "num" : "pct";
      return `<tr data-guardrail="${esc(g.metric)}"${g.message ? ` title="${esc(g.message)}"` : ""}>
        <td>${esc(g.metric)}</td>
        <td>${outcomeBadge(g.outcome)}</td>
        <td class="r">${at(g, "harm", hf, p)}</td>
        <td class="r">${at(g, "lower", hf, p)} … ${at(g, "upper", hf, p)}</td>
        <td class="r"${g.margin_text ? ` title="${esc(g.margin_text)}"` : ""}>${at(g, "margin", mf, p)}${abs ? " abs." : ""}</td>
        <td class="r">${at(g, "n_control", "count", p)}</td>
        <td class="r">${at(g, "n_candidate", "count", p)}</td>
        <td class="r">${at(g, "p_value", "p", p)}</td>
        <td class="muted">${g.message ? esc(g.message) : ""} ${more}</td>
      </tr>`;
    })
    .join("");
  return `<table class="grid compact evidence-guardrails"><thead><tr>
      <th>guardrail</th><th>outcome</th><th class="r" title="how much worse the candidate is: relative, or absolute (abs.) in the metric's unit">harm</th>
      <th class="r" title="always-valid bounds of the harm">bounds</th><th class="r">margin</th>
      <th class="r">n control</th><th class="r">n candidate</th><th class="r">p (harm)</th><th></th>
    </tr></thead><tbody>${rows}</tbody></table>`;
}

function srm(s, ptr) {
  if (!isObj(s)) return "";
  const counts = isObj(s.counts) ? s.counts : {};
  const weights = isObj(s.weights) ? s.weights : {};
  const names = [...new Set([...Object.keys(weights), ...Object.keys(counts)])];
  const arms = names
    .map((n) => `${esc(n)} ${at(counts, n, "count", `${ptr}/srm/counts`)} units (weight ${at(weights, n, "num", `${ptr}/srm/weights`)})`)
    .join(", ");
  const verdict = s.flagged ? `<b class="bad-text">sample ratio mismatch</b>` : "split ok";
  return `<div class="ev-srm" data-flagged="${Boolean(s.flagged)}">SRM in the stage window: ${verdict} — ${arms || DASH};
    p ${at(s, "p_value", "p", `${ptr}/srm`)}${s.message ? ` <span class="muted">(${esc(s.message)})</span>` : ""}</div>`;
}

function minimums(ev, ptr) {
  const units = isObj(ev.units) ? ev.units : {};
  const bits = [];
  if ("elapsed_s" in ev || "min_duration_s" in ev) {
    bits.push(`time in stage ${at(ev, "elapsed_s", "num", ptr)} of ${at(ev, "min_duration_s", "num", ptr)} s`);
  }
  if ("candidate_in_stage" in units || "min_units" in ev) {
    bits.push(`candidate units in stage ${at(units, "candidate_in_stage", "count", `${ptr}/units`)} of ${at(ev, "min_units", "count", ptr)}`);
  }
  if ("control" in units || "candidate" in units) {
    bits.push(`units control ${at(units, "control", "count", `${ptr}/units`)}, candidate ${at(units, "candidate", "count", `${ptr}/units`)}`);
  }
  const more = extras(units, new Set(["control", "candidate", "candidate_in_stage"]), `${ptr}/units`);
  return bits.length || more ? `<div class="ev-min">Minimums: ${bits.join(" · ")} ${more}</div>` : "";
}

function success(list, ptr) {
  if (!Array.isArray(list) || !list.length) return "";
  const items = list
    .map((s, j) => {
      const p = `${ptr}/success/${j}`;
      return `<span class="kv" data-success="${esc(s.metric)}">${esc(s.metric)} ${at(s, "lift", "lift", p)}
        (${at(s, "lower", "lift", p)} … ${at(s, "upper", "lift", p)})</span>`;
    })
    .join(" ");
  return `<div class="ev-success">Success metrics (always-valid, never gating): ${items}</div>`;
}

// The whole evidence of one look; `ptr` is the evidence object's JSON pointer.
export function renderEvidence(ev, ptr) {
  if (!isObj(ev) || !Object.keys(ev).length) return `<p class="muted">No evidence recorded with this decision.</p>`;
  const stage = "stage_percent" in ev ? `<span>stage ${at(ev, "stage_percent", "num", ptr)}%</span>` : "";
  const code = ev.code ? `<span>rule <code>${esc(ev.code)}</code></span>` : "";
  const more = extras(ev, KNOWN, ptr);
  return `<div class="evidence" data-evidence="${esc(ptr)}">
      <div class="facts">${stage}${code}</div>
      ${"guardrails" in ev ? guardrails(ev.guardrails, ptr) : ""}
      ${srm(ev.srm, ptr)}
      ${minimums(ev, ptr)}
      ${success(ev.success, ptr)}
      ${more ? `<div class="ev-more">${more}</div>` : ""}
    </div>`;
}
