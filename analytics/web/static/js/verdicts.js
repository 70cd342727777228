// Verdict names from the report schema (analytics/report/schema.py) → label and tone.

export const VERDICTS = {
  ship: { label: "ship", tone: "good", hint: "a success metric is significantly better; nothing is worse" },
  harm: { label: "harm", tone: "bad", hint: "a guardrail failed or a metric is significantly worse" },
  srm: { label: "SRM", tone: "bad", hint: "sample ratio mismatch: the split is off, trust nothing yet" },
  no_difference_yet: { label: "no difference yet", tone: "neutral", hint: "keep collecting data" },
  insufficient_data: {
    label: "insufficient data",
    tone: "neutral",
    hint: "fewer units than the tests need in a variant, or no evidence for a guardrail yet",
  },
};

export function badge(verdict, extra = "") {
  if (!verdict) return `<span class="badge neutral">—</span>`;
  const v = VERDICTS[verdict] || { label: verdict, tone: "neutral", hint: "" };
  return `<span class="badge ${v.tone}" data-verdict="${verdict}" title="${v.hint}">${v.label}${extra}</span>`;
}

export function statusBadge(status) {
  const tone = { running: "accent", rolled_back: "bad", completed: "good" }[status] || "neutral";
  return `<span class="pill ${tone}" data-status="${status}">${status.replace("_", " ")}</span>`;
}
