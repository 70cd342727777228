// Examples side by side (GET /api/experiments/{ref}/examples and /shadow-pairs).
//
// The examples page shows one column per variant (all variants, or those named by ?variant=),
// each a page of that variant's sampled requests under the same filters; ?metric= lists the
// requests behind a report metric. The shadow-pair page shows, per pair, the answer the user
// saw beside the shadow candidate's. Filters live in the URL (a plain GET form), so a view
// can be bookmarked and the report's metrics table links straight to one.
//
// Every prompt, answer, tag and judge name comes from users or models: it is set as
// textContent (or escaped), never parsed as HTML.

import { ApiError } from "./api.js";
import { count, DASH, esc, num, when } from "./format.js";

// Answers longer than this (characters or lines) are collapsed behind a "show all" button.
const COLLAPSE_CHARS = 600;
const COLLAPSE_LINES = 8;
// Filters the API takes, in the order the form shows them.
const FILTERS = ["category", "segment", "feedback", "score_min", "score_max", "judge", "error", "since", "until", "metric"];
const FEEDBACK_KINDS = ["thumbs_down", "thumbs_up", "regenerate", "copy", "edit", "rating", "task_success", "continued"];

function el(tag, cls, textValue) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  if (textValue !== undefined && textValue !== null) n.textContent = String(textValue);
  return n;
}

// The filters of the current URL (only those the API knows; empty ones dropped).
function urlFilters() {
  const params = new URLSearchParams(location.search);
  const out = {};
  for (const k of FILTERS) {
    const v = params.get(k);
    if (v !== null && v !== "") out[k] = v;
  }
  return { filters: out, variants: params.getAll("variant").filter((v) => v) };
}

function filterForm(kind, doc, state) {
  const f = state.filters;
  const input = (name, label, attrs = "") =>
    `<label>${label} <input name="${name}" value="${esc(f[name] ?? "")}" ${attrs}></label>`;
  // Shadow pairs are per shadow candidate: one at a time (the control serves, it is not mirrored).
  const pairVariants = (doc ? doc.variants : []).filter((v) => v !== (doc && doc.control));
  const variants = kind === "pairs"
    ? `<label>shadow variant <select name="variant"><option value="">any</option>${pairVariants
        .map((v) => `<option value="${esc(v)}"${state.variants[0] === v ? " selected" : ""}>${esc(v)}</option>`)
        .join("")}</select></label>`
    : (doc ? doc.variants : [])
    .map(
      (v) => `<label class="check"><input type="checkbox" name="variant" value="${esc(v)}"${state.variants.includes(v) ? " checked" : ""}>
        ${esc(v)}${doc && v === doc.control ? ' <span class="tag">control</span>' : ""}</label>`,
    )
    .join("");
  const feedback =
    kind === "examples"
      ? `<label>feedback <input name="feedback" list="feedback-kinds" value="${esc(f.feedback ?? "")}" size="12" placeholder="any"></label>
         <datalist id="feedback-kinds">${FEEDBACK_KINDS.map((k) => `<option value="${k}">`).join("")}</datalist>`
      : "";
  const metric = kind === "examples" && f.metric ? `<input type="hidden" name="metric" value="${esc(f.metric)}">` : "";
  return `<form id="filters" class="filters" method="get" action="">
      <span class="variants">${variants}</span>
      ${input("category", "category", 'size="8" placeholder="any"')}
      ${input("segment", "segment", 'size="12" placeholder="tag=value"')}
      ${feedback}
      ${input("score_min", "judge score ≥", 'size="5" inputmode="decimal"')}
      ${input("score_max", "≤", 'size="5" inputmode="decimal"')}
      ${input("judge", "judge", 'size="10" placeholder="any"')}
      <label>outcome <select name="error">
        <option value="">any</option>
        <option value="true"${f.error === "true" ? " selected" : ""}>failed</option>
        <option value="false"${f.error === "false" ? " selected" : ""}>succeeded</option>
      </select></label>
      ${input("since", "from", 'size="20" placeholder="2026-12-01T08:00Z"')}
      ${input("until", "to", 'size="20" placeholder="(now)"')}
      ${metric}
      <button type="submit">apply</button> <a href="${location.pathname}">clear</a>
    </form>`;
}

// A plain GET form, minus its empty fields (clean, shareable URLs).
function wireForm(root) {
  const form = root.querySelector("#filters");
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const params = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (String(v).trim() !== "") params.append(k, String(v).trim());
    params.set("refresh", "0");
    location.assign(`${location.pathname}?${params}`);
  });
}

// A prompt or an answer as stored: text (collapsed when long), a digest, or why there is none.
function content(field, c, label, failed) {
  const box = el("div", `content ${field}`);
  box.dataset.field = field;
  box.dataset.state = c.state;
  box.append(el("div", "content-label", label));
  if (c.state === "full") {
    const pre = el("pre", "output", c.text);
    pre.dataset.field = field;
    box.append(pre);
    const long = c.text.length > COLLAPSE_CHARS || c.text.split("\n").length > COLLAPSE_LINES;
    if (c.truncated) box.append(el("div", "muted", `… cut at ${count(c.text.length)} of ${count(c.length)} characters`));
    if (long) {
      pre.classList.add("collapsed");
      const btn = el("button", "expand", `show all ${count(c.text.length)} characters`);
      btn.type = "button";
      btn.addEventListener("click", () => {
        const open = pre.classList.toggle("collapsed") === false;
        btn.textContent = open ? "collapse" : `show all ${count(c.text.length)} characters`;
      });
      box.append(btn);
    }
  } else if (c.state === "hashed") {
    const code = el("code", "digest", c.text);
    code.dataset.field = field;
    box.append(el("span", "muted", "sha256 "), code);
  } else {
    const why = c.state === "withheld"
      ? "withheld (logged under another content_logging setting)"
      : failed && field === "response" ? "no answer (the call failed)" : "not logged";
    box.append(el("div", "muted", why));
  }
  return box;
}

function facts(it) {
  const line = el("div", "ex-facts");
  const add = (cls, value, title) => {
    const s = el("span", cls, value);
    if (title) s.title = title;
    line.append(s);
    return s;
  };
  if (it.role === "shadow") add("tag", "shadow");
  add(`badge ${it.status === "ok" && !it.fallback ? "good" : "bad"}`, it.fallback ? `fallback (${it.fallback_from || "?"})` : it.status === "ok" ? "ok" : `error ${it.http_status}${it.error_type ? ` ${it.error_type}` : ""}`);
  if (it.category) add("tag", it.category, "task category");
  for (const [k, v] of Object.entries(it.tags || {})) add("tag", `${k}=${v}`, "tag");
  add("muted", `${num(it.latency_ms)} ms`);
  if (it.completion_tokens != null) add("muted", `${count(it.completion_tokens)} tokens`);
  add("muted", when(it.ts));
  for (const f of it.feedback) add(`fb fb-${f.kind === "thumbs_down" ? "bad" : f.kind === "thumbs_up" ? "good" : "neutral"}`, f.kind === "rating" ? `rating ${f.value}` : f.kind, "feedback");
  for (const j of it.judgements) add("score", `${j.judge}: ${j.score == null ? `no score (${j.status})` : num(j.score)}`, "judge score");
  return line;
}

function example(it) {
  const box = el("article", "example");
  box.dataset.requestId = it.request_id;
  box.dataset.variant = it.variant;
  const head = el("div", "ex-head");
  head.append(el("code", "rid", it.request_id));
  box.append(head, facts(it), content("prompt", it.prompt, "prompt"), content("response", it.response, "answer", it.status !== "ok"));
  return box;
}

// A filter the API refused (422): its reason in the page, where the reader looks, instead of
// an empty list; the form stays so the filter can be corrected. A reader without the role to
// see stored content (403) is told so in the same place.
async function orRefused(root, load) {
  try {
    const out = await load();
    root.querySelector("#refused").hidden = true;
    return out;
  } catch (err) {
    if (!(err instanceof ApiError) || (err.status !== 422 && err.status !== 403)) throw err;
    const box = root.querySelector("#refused");
    box.textContent =
      err.status === 403
        ? `Not shown: stored prompts and answers are for operators and admins (${err.message.replace(/^403 /, "")}).`
        : `These filters were refused: ${err.message.replace(/^422 /, "")}`;
    box.hidden = false;
    return null;
  }
}

function banner(doc) {
  const tone = doc.content_logging === "full" ? "neutral" : "warn";
  const b = el("div", `banner ${tone}`, doc.note);
  b.id = "content-note";
  b.dataset.contentLogging = doc.content_logging;
  return b;
}

export class ExamplesPage {
  constructor(root, ref) {
    this.root = root;
    this.ref = ref;
    this.state = urlFilters();
    this.cursors = {}; // variant -> [cursor of each page shown so far] (index 0: first page)
    this.docs = {};
    this.shown = "";
    root.innerHTML = `<section class="card head" id="head"><div class="title"><h1>${esc(ref)}</h1><span class="pill neutral">examples</span></div></section>
      <section class="card" id="filter-card"></section>
      <div class="banner bad" id="refused" role="alert" hidden></div>
      <div id="note"></div>
      <div class="columns" id="columns"></div>`;
  }

  async refresh(api) {
    this.api = api;
    const out = await orRefused(this.root, () => this.load(api));
    if (out === null) {
      this.refused();
      return;
    }
    const key = JSON.stringify(out);
    if (key === this.shown) return; // unchanged: keep what the reader expanded
    this.shown = key;
    this.docs = out;
    this.head = Object.values(out)[0];
    this.render();
  }

  // Refused filters: the form (to correct them) and no stale columns.
  refused() {
    this.shown = "";
    this.root.querySelector("#columns").replaceChildren();
    if (!this.root.querySelector("#filters")) {
      this.root.querySelector("#filter-card").innerHTML = filterForm("examples", null, this.state);
      wireForm(this.root);
    }
  }

  async load(api) {
    // Which variants there are is in every answer: ask once (one item) when no column is named.
    if (!this.variantList) {
      this.variantList = this.state.variants.length
        ? this.state.variants
        : (await api.examples(this.ref, { ...this.state.filters, limit: 1 })).variants;
    }
    const out = {};
    for (const v of this.variantList) {
      const stack = this.cursors[v] || [null];
      this.cursors[v] = stack;
      const cursor = stack[stack.length - 1];
      out[v] = await api.examples(this.ref, { ...this.state.filters, variant: v, ...(cursor ? { cursor } : {}) });
    }
    return out;
  }

  async move(variant, delta) {
    const stack = this.cursors[variant];
    if (delta > 0 && this.docs[variant].next_cursor) stack.push(this.docs[variant].next_cursor);
    if (delta < 0 && stack.length > 1) stack.pop();
    await this.refresh(this.api);
  }

  render() {
    const d = this.head;
    const $ = (s) => this.root.querySelector(s);
    document.title = `liftgate — ${d.experiment.name} — examples`;
    const metric = d.metric ? ` <span class="pill accent" id="metric-pill" title="${esc(d.metric.note)}">behind ${esc(d.metric.name)}: ${esc(d.metric.note)}</span>` : "";
    $("#head").innerHTML = `<div class="title"><h1>${esc(d.experiment.name)}</h1><span class="pill neutral">examples</span>${metric}
      <a href="/dashboard/experiments/${encodeURIComponent(d.experiment.name)}">experiment page →</a>
      ${d.experiment.mode === "shadow" ? `<a id="pairs-link" href="/dashboard/experiments/${encodeURIComponent(d.experiment.name)}/shadow-pairs">shadow pairs →</a>` : ""}</div>
      <div class="facts"><span>${esc(d.order)}</span><span>content logging <b>${esc(d.content_logging)}</b></span></div>`;
    if (!$("#filters")) {
      $("#filter-card").innerHTML = filterForm("examples", d, this.state);
      wireForm(this.root);
    }
    $("#note").replaceChildren(banner(d));
    const cols = $("#columns");
    cols.replaceChildren();
    for (const [variant, doc] of Object.entries(this.docs)) {
      const col = el("section", "card column");
      col.dataset.column = variant;
      const h = el("h2", "", variant);
      if (variant === d.control) h.append(" ", el("span", "tag", "control"));
      const page = this.cursors[variant].length;
      const pager = el("div", "pager");
      const prev = el("button", "prev", "← previous");
      const next = el("button", "next", "next →");
      prev.type = next.type = "button";
      prev.disabled = page <= 1;
      next.disabled = !doc.next_cursor;
      prev.addEventListener("click", () => this.move(variant, -1));
      next.addEventListener("click", () => this.move(variant, 1));
      pager.append(prev, el("span", "page-info", `page ${page} · ${doc.items.length} shown`), next);
      col.append(h, pager);
      if (!doc.items.length) col.append(el("p", "empty", "No request matches these filters."));
      for (const it of doc.items) col.append(example(it));
      cols.append(col);
    }
  }
}

export class ShadowPairsPage {
  constructor(root, ref) {
    this.root = root;
    this.ref = ref;
    this.state = urlFilters();
    this.stack = [null];
    this.shown = "";
    root.innerHTML = `<section class="card head" id="head"><div class="title"><h1>${esc(ref)}</h1><span class="pill neutral">shadow pairs</span></div></section>
      <section class="card" id="filter-card"></section>
      <div class="banner bad" id="refused" role="alert" hidden></div>
      <div id="note"></div>
      <section class="card" id="pairs-card"><div class="pager"><button id="prev" type="button">← previous</button><span id="page-info"></span><button id="next" type="button">next →</button></div><div id="pairs"></div></section>`;
    root.querySelector("#prev").addEventListener("click", () => this.move(-1));
    root.querySelector("#next").addEventListener("click", () => this.move(1));
  }

  async refresh(api) {
    this.api = api;
    const cursor = this.stack[this.stack.length - 1];
    const filters = { ...this.state.filters };
    delete filters.feedback;
    delete filters.metric;
    const params = { ...filters, ...(this.state.variants[0] ? { variant: this.state.variants[0] } : {}), ...(cursor ? { cursor } : {}) };
    const doc = await orRefused(this.root, () => api.shadowPairs(this.ref, params));
    if (doc === null) {
      this.shown = "";
      this.root.querySelector("#pairs").replaceChildren();
      if (!this.root.querySelector("#filters")) {
        this.root.querySelector("#filter-card").innerHTML = filterForm("pairs", null, this.state);
        wireForm(this.root);
      }
      return;
    }
    const key = JSON.stringify(doc);
    if (key === this.shown) return;
    this.shown = key;
    this.doc = doc;
    this.render();
  }

  async move(delta) {
    if (delta > 0 && this.doc.next_cursor) this.stack.push(this.doc.next_cursor);
    if (delta < 0 && this.stack.length > 1) this.stack.pop();
    await this.refresh(this.api);
  }

  render() {
    const d = this.doc;
    const $ = (s) => this.root.querySelector(s);
    document.title = `liftgate — ${d.experiment.name} — shadow pairs`;
    $("#head").innerHTML = `<div class="title"><h1>${esc(d.experiment.name)}</h1><span class="pill neutral">shadow pairs</span>
      <a href="/dashboard/experiments/${encodeURIComponent(d.experiment.name)}">experiment page →</a>
      <a href="/dashboard/experiments/${encodeURIComponent(d.experiment.name)}/examples">examples →</a></div>
      <div class="facts"><span>${esc(d.order)}</span><span>content logging <b>${esc(d.content_logging)}</b></span></div>`;
    if (!$("#filters")) {
      $("#filter-card").innerHTML = filterForm("pairs", d, this.state);
      wireForm(this.root);
    }
    $("#note").replaceChildren(banner(d));
    $("#page-info").textContent = `page ${this.stack.length} · ${d.pairs.length} pairs`;
    $("#prev").disabled = this.stack.length <= 1;
    $("#next").disabled = !d.next_cursor;
    const list = $("#pairs");
    list.replaceChildren();
    if (!d.pairs.length) {
      list.append(el("p", "empty", d.experiment.mode === "shadow" ? "No shadow pair matches these filters." : "This experiment mirrors no traffic: it has no shadow pairs."));
      return;
    }
    for (const p of d.pairs) {
      const box = el("div", "pair");
      box.dataset.pairId = p.pair_id || "";
      const head = el("div", "lost-head", p.category || DASH);
      if (p.same_response) head.append(el("span", "tag", "same answer"));
      const sides = el("div", "sides");
      for (const [who, it] of [["primary", p.primary], ["shadow", p.shadow]]) {
        const side = el("div", `side ${who}`);
        side.dataset.side = who;
        if (!it) {
          side.append(el("div", "side-head", `${who}: not found`), el("p", "empty", "The primary call of this pair is not stored (yet)."));
        } else {
          side.append(el("div", "side-head", `${it.variant} — ${who === "primary" ? "what the user saw" : "shadow candidate"}`));
          const ex = example(it);
          side.append(ex);
        }
        sides.append(side);
      }
      box.append(head, sides);
      list.append(box);
    }
  }
}
