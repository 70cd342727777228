// Shadow experiments: candidate − baseline differences over pairs of calls on the same
// prompt (report.paired, one PairedComparison per shadow candidate).

import { cell, DASH, esc, when } from "./format.js";

const LABELS = {
  latency_ms: "latency (ms)",
  response_chars: "response length (chars)",
  error: "error rate",
  completion_tokens: "completion tokens",
  ttft_ms: "time to first token (ms)",
};

export function renderPaired(comparisons) {
  if (!comparisons.length) return `<p class="empty">No shadow pairs yet.</p>`;
  return comparisons.map((c, k) => comparison(c, k)).join("");
}

function comparison(c, k) {
  const base = `/paired/${k}`;
  const rows = c.metrics
    .map((m, i) => {
      const ptr = `${base}/metrics/${i}`;
      // Error is a rate: its means are shares and its difference is in percentage points.
      const fmt = m.name === "error" ? "pct" : "num";
      const dfmt = m.name === "error" ? "lift" : "diff";
      const ci = m.ci ? `${cell(m.ci.lower, dfmt, `${ptr}/ci/lower`)} … ${cell(m.ci.upper, dfmt, `${ptr}/ci/upper`)}` : DASH;
      return `<tr data-paired-metric="${esc(m.name)}"${m.error ? ` title="${esc(m.error.message)}"` : ""}>
        <td>${esc(LABELS[m.name] || m.name)}</td>
        <td class="r">${cell(m.pairs, "count", `${ptr}/pairs`)}</td>
        <td class="r">${cell(m.baseline_mean, fmt, `${ptr}/baseline_mean`)}</td>
        <td class="r">${cell(m.candidate_mean, fmt, `${ptr}/candidate_mean`)}</td>
        <td class="r">${cell(m.mean_difference, dfmt, `${ptr}/mean_difference`)}</td>
        <td class="r">${ci}</td>
        <td class="r">${cell(m.p_value, "p", `${ptr}/p_value`)}</td>
      </tr>`;
    })
    .join("");
  const agreement =
    c.agreement == null
      ? `<span class="muted">agreement not measurable (no comparable content logged)</span>`
      : `agreement ${cell(c.agreement, "pct", `${base}/agreement`)}${c.agreement_basis ? ` <span class="muted">(${esc(c.agreement_basis)})</span>` : ""}`;
  return `<div class="paired" data-variant="${esc(c.variant)}">
    <div class="facts">
      <span><b>${esc(c.variant)}</b> vs <b>${esc(c.baseline)}</b></span>
      <span>${cell(c.pairs, "count", `${base}/pairs`)} pairs${c.sampled ? " (sampled)" : ""}</span>
      <span>${agreement}</span>
      <span class="muted">${when(c.window_start)} – ${when(c.window_end)}</span>
      ${c.error ? `<span class="bad-text">${esc(c.error.message)}</span>` : ""}
    </div>
    <table class="grid compact"><thead><tr>
      <th>measure</th><th class="r">pairs</th><th class="r">baseline</th><th class="r">candidate</th>
      <th class="r">difference</th><th class="r">95% CI</th><th class="r">p</th>
    </tr></thead><tbody>${rows}</tbody></table>
  </div>`;
}
