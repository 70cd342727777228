// The offline gate page (GET /api/experiments/{ref}/offline-gate): the rollout hook's answer
// per candidate, the newest gate decision with its per-category evidence, the category ×
// variant matrix of the newest runs coloured by verdict, and the items the candidate lost
// with both outputs side by side. Model outputs and scorer reasons are set as textContent,
// never parsed as HTML: an output is whatever a model wrote, markup included.

import { cell, DASH, esc, key, when } from "./format.js";

const PAGE = 20;

// Gate verdicts (evals/gate.py) → label and tone; anything else is shown by name, red.
const VERDICTS = {
  pass: { tone: "good", hint: "not worse than the margin allows, every requirement met" },
  forgetting: { tone: "bad", hint: "significantly worse than the baseline by more than the margin" },
  insufficient: { tone: "warn", hint: "too few paired items (min_items) or no test could be computed" },
  no_margin: { tone: "bad", hint: "no margin declared for this category and no default" },
  below_minimum: { tone: "bad", hint: "the candidate's pass rate is under the declared minimum" },
  no_improvement: { tone: "bad", hint: "a required improvement is not shown" },
  not_noninferior: { tone: "bad", hint: "non-inferiority required and not shown" },
};

function verdictBadge(v) {
  if (!v) return `<span class="badge neutral" title="no decision was taken on this run">not gated</span>`;
  const d = VERDICTS[v] || { tone: "bad", hint: "" };
  return `<span class="badge ${d.tone}" data-gate-verdict="${esc(v)}" title="${esc(d.hint)}">${esc(v.replaceAll("_", " "))}</span>`;
}

const SKELETON = `
  <section class="card head" id="head"></section>
  <section class="card" id="hook-card"><h2>Traffic</h2><div id="hook"></div></section>
  <section class="card" id="decision-card"><h2>Gate decision</h2><div id="decisions"></div></section>
  <section class="card" id="matrix-card">
    <h2>Pass rate by category and variant <span class="hint">newest run of each; 95% Wilson interval</span></h2>
    <div id="matrix"></div>
    <div class="legend">
      <span><i class="sw good"></i>pass</span><span><i class="sw bad"></i>forgetting (or another failed rule)</span>
      <span><i class="sw warn"></i>insufficient</span><span><i class="sw neutral"></i>not gated (baseline, or a run no decision judged)</span>
    </div>
  </section>
  <section class="card" id="failing-card">
    <h2>Items the candidate failed and the baseline passed</h2>
    <div class="pager"><button id="prev" type="button">← previous</button><span id="page-info"></span><button id="next" type="button">next →</button></div>
    <div id="failing"></div>
  </section>`;

export class OfflineGatePage {
  constructor(root, ref) {
    this.root = root;
    this.ref = ref;
    this.offset = 0;
    this.doc = null;
    root.innerHTML = SKELETON;
    root.querySelector("#prev").addEventListener("click", () => this.page(-PAGE));
    root.querySelector("#next").addEventListener("click", () => this.page(PAGE));
  }

  async page(delta) {
    const total = this.doc ? this.doc.failing_items.total : 0;
    this.offset = Math.max(0, Math.min(this.offset + delta, Math.max(0, total - 1)));
    await this.refresh(this.api);
  }

  async refresh(api) {
    this.api = api;
    this.doc = await api.offlineGate(this.ref, PAGE, this.offset);
    this.render();
  }

  render() {
    const d = this.doc;
    const $ = (sel) => this.root.querySelector(sel);
    document.title = `liftgate — ${d.experiment.name} — offline gate`;
    $("#head").innerHTML = head(d);
    $("#hook").innerHTML = hook(d);
    fillHookReasons(this.root, d);
    $("#decisions").innerHTML = decisions(d);
    $("#matrix").innerHTML = matrix(d);
    renderFailing($("#failing"), d.failing_items);
    const f = d.failing_items;
    $("#page-info").textContent = f.total
      ? `${f.offset + 1}–${f.offset + f.items.length} of ${f.total}`
      : "none";
    $("#prev").disabled = f.offset <= 0;
    $("#next").disabled = f.offset + f.items.length >= f.total;
  }
}

function head(d) {
  const decl = d.declaration;
  const margins = decl
    ? Object.entries(decl.margins || {}).map(([c, m], i) => `${esc(c)} ${cell(m, "pts", `/declaration/margins/${key(c)}`)}`).join(", ")
    : "";
  return `<div class="title"><h1>${esc(d.experiment.name)}</h1><span class="pill neutral">offline gate</span>
      <a href="/dashboard/experiments/${encodeURIComponent(d.experiment.name)}">experiment page →</a></div>
    <div class="facts" id="declaration">${decl
      ? `<span>suites <b>${esc((decl.suites || []).join(", "))}</b></span>
         <span>margins ${margins || DASH}; default ${decl.default_margin == null ? "none (undeclared categories fail)" : cell(decl.default_margin, "pts", "/declaration/default_margin")}</span>
         <span>α ${cell(decl.alpha, "p", "/declaration/alpha")}</span>
         <span>min items ${cell(decl.min_items, "count", "/declaration/min_items")}</span>
         <span class="muted">declared by ${esc(d.declared_by)} ${when(d.declared_at)}</span>`
      : `<span>No offline gate declared${d.required ? `, <b class="bad-text">but the rollout plan requires one</b>` : ""}: <code>liftgate eval gate ${esc(d.experiment.name)} --declare gate.yaml</code></span>`}
      <span>control <b>${esc(d.control || DASH)}</b></span></div>`;
}

// What the rollout controller and the admin API will do with each candidate now.
function hook(d) {
  if (!d.candidates.length) return `<p class="empty">No candidate variant.</p>`;
  return d.candidates
    .map((c) => {
      const k = c.check;
      const tone = k.passed ? "good" : "bad";
      // A running A/B test checked the gate when it started: a gate declared since takes the
      // candidate's users away only once a decision fails (control.gates pauses the test),
      // and the page must not say it already has.
      const line = !k.required
        ? `<b>${esc(c.variant)}</b>: not held by an offline gate (none declared).`
        : k.passed
          ? `<b>${esc(c.variant)}</b> may get traffic: the offline gate passed for it as configured now.`
          : c.serving
            ? `<b>${esc(c.variant)}</b> is still getting traffic although the offline gate has not passed for it as configured now: this A/B test checked the gate when it started, and a failing decision will pause it. Pause the experiment to stop it now (starting again checks the gate).`
            : `<b>${esc(c.variant)}</b> gets no traffic until the offline gate passes for it as configured now.`;
      return `<div class="banner ${k.required ? tone : "neutral"}" data-hook="${esc(c.variant)}" data-passed="${k.passed}" data-required="${k.required}" data-serving="${c.serving}">
        ${line} <span class="hook-reason"></span></div>`;
    })
    .join("");
}

function decisions(d) {
  if (!d.candidates.length) return "";
  return d.candidates
    .map((c, k) => {
      const x = c.decision;
      if (!x) {
        return `<div class="gate-decision" data-variant="${esc(c.variant)}"><b>${esc(c.variant)}</b>: no decision yet.
          <span class="muted">Run the declared suites (<code>liftgate eval run SUITE --experiment ${esc(d.experiment.name)}</code>), then <code>liftgate eval gate ${esc(d.experiment.name)}</code>.</span></div>`;
      }
      const ptr = `/candidates/${k}/decision`;
      const rows = x.categories
        .map((cat, i) => {
          const p = `${ptr}/categories/${i}`;
          return `<tr data-category="${esc(cat.category)}" class="tone-${(VERDICTS[cat.verdict] || { tone: "bad" }).tone}">
            <td>${esc(cat.category)}</td>
            <td class="r">${cell(cat.n, "count", `${p}/n`)}</td>
            <td class="r">${cell(cat.baseline, "pct", `${p}/baseline`)}</td>
            <td class="r">${cell(cat.candidate, "pct", `${p}/candidate`)}</td>
            <td class="r lift">${cell(cat.difference, "pts", `${p}/difference`)}</td>
            <td class="r">${cell(cat.ci_lower, "pts", `${p}/ci_lower`)} … ${cell(cat.ci_upper, "pts", `${p}/ci_upper`)}</td>
            <td class="r">${cell(cat.p_worse_holm, "p", `${p}/p_worse_holm`)}</td>
            <td class="r">${cell(cat.margin, "pts", `${p}/margin`)}</td>
            <td>${verdictBadge(cat.verdict)}</td>
          </tr>`;
        })
        .join("");
      const stale = x.current
        ? ""
        : ` <span class="pill warn" title="the candidate, the baseline or the declaration changed since">no longer current</span>`;
      return `<div class="gate-decision" data-variant="${esc(c.variant)}" data-decision-id="${x.id}">
        <div><b>${esc(c.variant)}</b> vs ${esc(x.baseline)}
          <span class="badge ${x.passed ? "good" : "bad"}" data-gate="${esc(x.verdict)}">${x.passed ? "passed" : "failed"}</span>${stale}
          <span class="muted">decision ${x.id}, ${when(x.created_at)} by ${esc(x.actor)}; model <code>${esc(x.model)}</code> on <code>${esc(x.upstream)}</code></span></div>
        <ul class="reasons">${x.reasons.map((r) => `<li class="bad-text">${esc(r)}</li>`).join("")}</ul>
        <table class="grid compact gate-evidence"><thead><tr>
          <th>category</th><th class="r">items</th><th class="r">${esc(x.baseline)}</th><th class="r">${esc(c.variant)}</th>
          <th class="r" title="candidate − baseline pass rate, in points">Δ</th><th class="r" title="Newcombe paired 95% interval">95% CI</th>
          <th class="r" title="one-sided McNemar (worse), Holm-adjusted across categories">p worse (Holm)</th><th class="r">margin</th><th>verdict</th>
        </tr></thead><tbody>${rows || `<tr><td colspan="9" class="muted">no category compared</td></tr>`}</tbody></table>
      </div>`;
    })
    .join("");
}

function matrix(d) {
  const m = d.matrix;
  if (!m.rows.length) return `<p class="empty">No eval run yet for this experiment.</p>`;
  const head = m.variants.map((v) => `<th class="r">${esc(v)}${v === d.control ? ' <span class="tag">control</span>' : ""}</th>`).join("");
  const rows = m.rows
    .map((row, i) => {
      const cells = m.variants
        .map((v) => {
          const c = row.cells[v];
          if (!c) return `<td class="r muted">${DASH}</td>`;
          const p = `/matrix/rows/${i}/cells/${key(v)}`;
          const tone = c.verdict ? (VERDICTS[c.verdict] || { tone: "bad" }).tone : "neutral";
          const status = c.status === "completed" ? "" : ` <span class="tag">${esc(c.status)}</span>`;
          const errors = c.errors ? ` <span class="bad-text">${cell(c.errors, "count", `${p}/errors`)} failed calls</span>` : "";
          return `<td class="r mcell ${tone}" data-variant="${esc(v)}" data-verdict="${esc(c.verdict || "")}" title="${esc(c.verdict || "not gated")}">
            <b>${cell(c.pass_rate, "pct", `${p}/pass_rate`)}</b>
            <span class="ci">[${cell(c.ci_lower, "pct", `${p}/ci_lower`)} – ${cell(c.ci_upper, "pct", `${p}/ci_upper`)}]</span>
            <span class="muted">${cell(c.passed, "count", `${p}/passed`)}/${cell(c.outputs, "count", `${p}/outputs`)}</span>${status}${errors}</td>`;
        })
        .join("");
      return `<tr data-row="${esc(row.dataset)}/${esc(row.category)}"><td>${esc(row.dataset)} · <b>${esc(row.category)}</b></td>${cells}</tr>`;
    })
    .join("");
  return `<table class="grid matrix" id="gate-matrix"><thead><tr><th>dataset · category</th>${head}</tr></thead><tbody>${rows}</tbody></table>`;
}

// Built with the DOM: every piece of text that came from a model or a scorer is textContent.
function renderFailing(el, f) {
  el.replaceChildren();
  if (!f.items.length) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = f.total ? "No items on this page." : "None: the candidate lost no item the baseline passed.";
    el.append(p);
    return;
  }
  const text = (tag, cls, value) => {
    const n = document.createElement(tag);
    if (cls) n.className = cls;
    n.textContent = value ?? "";
    return n;
  };
  for (const it of f.items) {
    const box = document.createElement("div");
    box.className = "lost";
    box.dataset.item = `${it.dataset}/${it.item_id}/${it.sample}`;
    const title = text("div", "lost-head", `${it.dataset} / ${it.item_id}`);
    title.append(text("span", "tag", it.category), text("span", "muted", ` ${it.variant} vs ${it.baseline}${it.sample ? `, sample ${it.sample}` : ""}`));
    const sides = document.createElement("div");
    sides.className = "sides";
    for (const [who, name, out, chars, reason, extra] of [
      ["baseline", it.baseline, it.baseline_output, it.baseline_output_chars, it.baseline_reason, null],
      ["candidate", it.variant, it.candidate_output, it.candidate_output_chars, it.candidate_reason, it.candidate_error],
    ]) {
      const side = document.createElement("div");
      side.className = `side ${who}`;
      side.append(text("div", "side-head", `${name} — ${who === "baseline" ? "passed" : "failed"}`));
      const pre = text("pre", "output", out);
      pre.dataset.side = who;
      side.append(pre);
      if (out != null && chars > out.length) side.append(text("div", "muted", `… cut at ${out.length.toLocaleString("en")} of ${chars.toLocaleString("en")} characters`));
      const why = text("div", "reason", reason);
      why.dataset.side = who;
      side.append(why);
      if (extra) side.append(text("div", "bad-text", `call failed: ${extra}`));
      sides.append(side);
    }
    box.append(title, sides);
    el.append(box);
  }
}

// The hook's reason is text from the database (it quotes gate reasons): textContent too.
function fillHookReasons(root, doc) {
  for (const c of doc.candidates) {
    const el = root.querySelector(`[data-hook="${CSS.escape(c.variant)}"] .hook-reason`);
    if (el) el.textContent = `(${c.check.reason})`;
  }
}
