// The two charts of the experiment page, drawn with the vendored Chart.js (global `Chart`).
// Charts are created once and updated in place on every poll (no flicker, no re-layout).

import { clock, lift, p, pct, when } from "./format.js";

export const TONE = { good: "#1a7f37", bad: "#cf222e", neutral: "#8c959f", guard: "#8250df", accent: "#0969da" };
const FAINT = { good: "rgba(26,127,55,0.25)", bad: "rgba(207,34,46,0.25)", neutral: "rgba(140,149,159,0.28)" };

// Significance and direction → colour: green significantly better, red significantly
// worse (or a failed guardrail), grey inconclusive.
export function tone(result) {
  if (!result || result.is_control) return "neutral";
  if (result.guardrail && result.guardrail.outcome === "fail") return "bad";
  if (result.significant && result.better === true) return "good";
  if (result.significant && result.better === false) return "bad";
  return "neutral";
}

const pcts = (iv) => (iv ? [iv.lower * 100, iv.upper * 100] : null);

// Axis range from the estimates and fixed-horizon intervals (padded, never narrower than
// ±5%): early on the always-valid intervals are very wide and would squash everything
// else, so they are clipped at the plot edge instead (their exact ends are in the tooltip).
function focusRange(values) {
  const xs = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  if (!xs.length) return { min: undefined, max: undefined };
  let lo = Math.min(0, ...xs);
  let hi = Math.max(0, ...xs);
  const pad = Math.max((hi - lo) * 0.15, 1);
  lo = Math.min(lo - pad, -5);
  hi = Math.max(hi + pad, 5);
  // Round outwards to a 1-2-5 step so the end ticks are round numbers.
  const raw = (hi - lo) / 6;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].find((m) => m * mag >= raw) * mag;
  return { min: Math.floor(lo / step) * step, max: Math.ceil(hi / step) * step };
}
const zeroGrid = (ctx) => (ctx.tick && ctx.tick.value === 0 ? "#57606a" : "rgba(0,0,0,0.07)");

function baseOptions() {
  return {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    font: { family: "'DejaVu Sans', 'Liberation Sans', sans-serif" },
  };
}

// Forest plot: one row per metric × candidate. Wide pale bar = always-valid (sequential)
// interval the verdict uses; thin dark bar = fixed-horizon interval; diamond = estimate;
// purple tick = a guardrail's non-inferiority margin.
export class ForestChart {
  constructor(canvas) {
    this.rows = [];
    const rows = () => this.rows;
    this.chart = new Chart(canvas, {
      type: "bar",
      data: { labels: [], datasets: [] },
      options: {
        ...baseOptions(),
        indexAxis: "y",
        scales: {
          x: {
            title: { display: true, text: "relative lift vs control (%)" },
            grid: { color: zeroGrid },
          },
          y: {
            type: "category",
            grid: { display: false },
            ticks: {
              color: (ctx) => (rows()[ctx.index] && rows()[ctx.index].metric.guardrail ? TONE.guard : "#24292f"),
              font: { size: 11 },
              // Whole names, wrapped onto lines (never cut or skipped): the rows grow instead.
              autoSkip: false,
              callback: (_, i) => wrapLabel(rows()[i] ? rows()[i].label : ""),
            },
          },
        },
        plugins: {
          // The encoding is explained by the HTML legend under the chart (colours vary per row).
          legend: { display: false },
          tooltip: {
            callbacks: {
              title: (items) => (items.length ? rows()[items[0].dataIndex].label : ""),
              label: () => null,
              afterBody: (items) => (items.length ? forestTooltip(rows()[items[0].dataIndex]) : []),
            },
          },
        },
      },
    });
  }

  update(rows) {
    this.rows = rows;
    const c = this.chart;
    c.data.labels = rows.map((r) => r.label);
    const colours = rows.map((r) => TONE[tone(r.result)]);
    c.data.datasets = [
      {
        label: "sequential CI",
        data: rows.map((r) => pcts(r.result.sequential_ci_relative)),
        backgroundColor: rows.map((r) => FAINT[tone(r.result)]),
        barThickness: 14,
        grouped: false,
        order: 3,
      },
      {
        label: "fixed-horizon CI",
        data: rows.map((r) => pcts(r.result.ci_relative)),
        backgroundColor: colours,
        barThickness: 4,
        grouped: false,
        order: 2,
      },
      {
        type: "scatter",
        label: "lift",
        data: rows.map((r) => ({ x: r.result.lift_relative == null ? null : r.result.lift_relative * 100, y: r.label })),
        backgroundColor: colours,
        borderColor: "#ffffff",
        pointStyle: "rectRot",
        pointRadius: 6,
        pointHoverRadius: 8,
        order: 1,
      },
      {
        type: "scatter",
        label: "guardrail margin",
        data: rows.map((r) => ({ x: r.metric.guardrail && r.metric.margin != null ? marginX(r.metric) : null, y: r.label })),
        borderColor: TONE.guard,
        backgroundColor: TONE.guard,
        pointStyle: "line",
        rotation: 90,
        pointRadius: 9,
        borderWidth: 2,
        order: 0,
      },
    ];
    const range = focusRange(
      rows.flatMap((r) => [
        r.result.lift_relative == null ? null : r.result.lift_relative * 100,
        ...(pcts(r.result.ci_relative) || []),
        r.metric.guardrail && r.metric.margin != null ? marginX(r.metric) : null,
      ]),
    );
    c.options.scales.x.min = range.min;
    c.options.scales.x.max = range.max;
    // Rows are evenly spaced: each gets room for the tallest wrapped label, so none overlap.
    const lines = Math.max(1, ...rows.map((r) => wrapLabel(r.label).length));
    c.canvas.parentNode.style.height = `${Math.max(160, rows.length * Math.max(21, lines * LINE_PX + 6) + 80)}px`;
    // Take the box's new height now: Chart.js would follow it only when its ResizeObserver
    // runs, after this update, and the frame between would squeeze the rows into the old one.
    c.resize();
    c.update("none");
  }
}

// A forest label on lines of at most WRAP characters, broken at spaces (a longer word stays
// whole on its own line), so a metric's full name is always readable.
const WRAP = 40;
const LINE_PX = 14; // 11 px labels at Chart.js's 1.2 line height, rounded up
export function wrapLabel(label) {
  const lines = [];
  let line = "";
  for (const word of String(label).split(/\s+/).filter(Boolean)) {
    if (line && line.length + 1 + word.length > WRAP) {
      lines.push(line);
      line = word;
    } else {
      line = line ? `${line} ${word}` : word;
    }
  }
  if (line || !lines.length) lines.push(line);
  return lines;
}

function marginX(metric) {
  // The margin sits on the "worse" side: below zero when higher is better.
  return (metric.direction === "increase" ? -metric.margin : metric.margin) * 100;
}

function forestTooltip(row) {
  const r = row.result;
  const iv = (x) => (x ? `${lift(x.lower)} … ${lift(x.upper)}` : "—");
  const lines = [
    `lift ${lift(r.lift_relative)} (${row.metric.direction === "increase" ? "higher" : "lower"} is better)`,
    `sequential CI ${iv(r.sequential_ci_relative)}`,
    `fixed CI ${iv(r.ci_relative)}`,
    `p ${p(r.p_value)} · Holm ${p(r.p_holm)} · BH ${p(r.p_bh)}`,
    `sequential p (Holm) ${p(r.p_sequential_holm)}`,
    `chance to beat control ${pct(r.chance_to_beat_control)}`,
  ];
  if (r.guardrail) lines.push(`guardrail: ${r.guardrail.outcome} (margin ${pct(r.guardrail.margin)})`);
  if (r.error) lines.push(`note: ${r.error.message}`);
  return lines;
}

// Cumulative relative lift over time with the always-valid band (shaded) and the
// fixed-horizon interval (dashed): the band is what may be watched continuously.
export class LiftOverTimeChart {
  constructor(canvas) {
    const band = "rgba(9,105,218,0.14)";
    const line = (label, extra) => ({ label, data: [], pointRadius: 0, borderWidth: 1, spanGaps: false, ...extra });
    this.chart = new Chart(canvas, {
      type: "line",
      data: {
        datasets: [
          line("sequential CI", { borderWidth: 0, backgroundColor: band, fill: "+1" }),
          line("sequential CI (lower)", { borderWidth: 0, backgroundColor: band, fill: false }),
          line("fixed-horizon CI", { borderColor: "#57606a", borderDash: [4, 3], fill: false }),
          line("fixed-horizon CI (lower)", { borderColor: "#57606a", borderDash: [4, 3], fill: false }),
          line("cumulative lift", { borderColor: TONE.accent, backgroundColor: TONE.accent, borderWidth: 2, pointRadius: 2 }),
        ],
      },
      options: {
        ...baseOptions(),
        interaction: { mode: "index", intersect: false },
        scales: {
          x: {
            type: "linear",
            ticks: { callback: (v) => this.tickLabel(v), maxTicksLimit: 6 },
            grid: { color: "rgba(0,0,0,0.05)" },
          },
          y: { title: { display: true, text: "relative lift (%)" }, grid: { color: zeroGrid } },
        },
        plugins: {
          legend: {
            position: "bottom",
            labels: { boxWidth: 12, font: { size: 11 }, filter: (item) => !item.text.includes("(lower)") },
          },
          tooltip: {
            callbacks: {
              title: (items) => (items.length ? clock(items[0].parsed.x) : ""),
              label: (item) => `${item.dataset.label}: ${item.parsed.y == null ? "—" : item.parsed.y.toFixed(1) + "%"}`,
            },
          },
        },
      },
    });
  }

  tickLabel(ms) {
    // Long experiments: the date matters more than the seconds.
    if (!this.chart) return clock(ms); // first layout runs inside the Chart constructor
    const xs = this.chart.data.datasets[4].data;
    const span = xs.length > 1 ? xs[xs.length - 1].x - xs[0].x : 0;
    return span > 20 * 3600 * 1000 ? when(new Date(ms).toISOString()).slice(0, 17) : clock(ms);
  }

  update(points) {
    const at = (f) => points.map((pt) => ({ x: Date.parse(pt.t), y: f(pt) == null ? null : f(pt) * 100 }));
    const ds = this.chart.data.datasets;
    ds[0].data = at((pt) => pt.sequential_ci_relative && pt.sequential_ci_relative.upper);
    ds[1].data = at((pt) => pt.sequential_ci_relative && pt.sequential_ci_relative.lower);
    ds[2].data = at((pt) => pt.ci_relative && pt.ci_relative.upper);
    ds[3].data = at((pt) => pt.ci_relative && pt.ci_relative.lower);
    ds[4].data = at((pt) => pt.lift_relative);
    const range = focusRange([...ds[2].data, ...ds[3].data, ...ds[4].data].map((d) => d.y));
    this.chart.options.scales.y.min = range.min;
    this.chart.options.scales.y.max = range.max;
    this.chart.update("none");
  }
}
