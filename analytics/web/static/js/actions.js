// The experiment page's actions: start / pause / stop, rollout advance / pause / resume /
// roll back (after a confirmation showing the evidence the controller would act on), and
// the variants' weights. Every button calls the control plane's /admin API, as the CLI does;
// the page shows the service's refusal as it is worded there.

import { esc } from "./format.js";
import { renderEvidence, summary } from "./evidence.js";
import { renderLook } from "./rollout.js";
import { act, may, me } from "./session.js";

const TRANSITIONS = { start: ["draft", "paused"], pause: ["running"], stop: ["draft", "running", "paused"] };
const ROLLOUT = ["advance", "pause", "resume", "rollback"];
const q = encodeURIComponent;

export class ActionsCard {
  constructor(anchor, ref, api) {
    this.ref = ref;
    this.api = api;
    this.el = document.createElement("section");
    this.el.className = "card";
    this.el.id = "actions-card";
    this.el.hidden = true;
    anchor.after(this.el);
    this.el.addEventListener("click", (ev) => this.onClick(ev));
    this.el.addEventListener("submit", (ev) => this.onSubmit(ev));
  }

  async load() {
    const who = await me();
    this.who = who;
    if (!may(who, "operator")) return; // viewers read; the API refuses them anyway
    this.exp = await act("GET", `/admin/experiments/${q(this.ref)}`);
    this.draw();
  }

  draw(message = "", bad = false) {
    const e = this.exp;
    const buttons = Object.entries(TRANSITIONS)
      .filter(([, from]) => from.includes(e.status))
      .map(([a]) => `<button type="button" data-action="${a}">${a}</button>`)
      .join("");
    const rollout =
      e.mode === "rollout"
        ? `<div class="actions" id="rollout-actions">rollout: ${ROLLOUT.map(
            (a) => `<button type="button" data-rollout="${a}">${a === "rollback" ? "roll back" : a}</button>`,
          ).join("")}</div>`
        : "";
    // A started A/B test keeps its split (the API refuses a change): shown, not offered.
    const split = e.mode === "ab" && e.started_at;
    const weights = split
      ? e.variants.map((v) => `${esc(v.name)}${v.is_control ? " (control)" : ""} ${esc(v.weight)}`).join(", ")
      : e.variants
          .map(
            (v, i) => `<label>${esc(v.name)}${v.is_control ? " (control)" : ""}
          <input type="number" min="0" step="any" name="w${i}" value="${esc(v.weight)}" data-variant="${esc(v.name)}"></label>`,
          )
          .join(" ");
    const weightsRow = split
      ? `<p class="actions" id="weights-fixed">weights ${weights} <span class="muted">— fixed once an A/B test has started; to ramp a candidate, run a rollout</span></p>`
      : `<form id="weights-form" class="actions">weights ${weights} <button type="submit">save weights</button></form>`;
    this.el.hidden = false;
    this.el.innerHTML = `<h2>Actions <span class="hint">as ${esc(this.who?.name || "")}</span></h2>
      <div class="actions" id="experiment-actions">status <b id="action-status">${esc(e.status)}</b> ${buttons}</div>
      ${rollout}
      ${weightsRow}
      <p id="action-result" class="${bad ? "bad-text" : "muted"}" role="status">${esc(message)}</p>
      <dialog id="confirm-dialog"><form method="dialog">
        <h3 id="confirm-title"></h3><div id="confirm-evidence"></div>
        <menu><button value="cancel" id="confirm-cancel">cancel</button>
        <button value="ok" id="confirm-ok" class="primary">confirm</button></menu></form></dialog>`;
  }

  async run(label, fn) {
    try {
      const out = await fn();
      this.exp = await act("GET", `/admin/experiments/${q(this.ref)}`);
      this.draw(`${label}: done${out && out.decision ? ` — ${out.decision.reason || out.decision.decision}` : ""}`);
    } catch (err) {
      this.draw(`${label}: ${err.message}`, true);
    }
  }

  async onClick(ev) {
    const target = ev.target.closest("button");
    if (!target) return;
    if (target.dataset.action) {
      const a = target.dataset.action;
      await this.run(a, () => act("POST", `/admin/experiments/${q(this.ref)}/${a}`));
    } else if (target.dataset.rollout) {
      const a = target.dataset.rollout;
      if (await this.confirm(a)) {
        await this.run(`rollout ${a}`, () => act("POST", `/admin/experiments/${q(this.ref)}/rollout/${a}`));
      }
    }
  }

  // The confirmation shows the evidence now: the controller's live look (from the report)
  // and the latest decision's evidence (from the rollout API).
  async confirm(action) {
    const dialog = this.el.querySelector("#confirm-dialog");
    this.el.querySelector("#confirm-title").textContent = `${action === "rollback" ? "Roll back" : action} ${this.ref}?`;
    const box = this.el.querySelector("#confirm-evidence");
    box.innerHTML = `<p class="muted">loading the current evidence…</p>`;
    // Listen before loading: the answer may come before the evidence does.
    const answer = new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    });
    dialog.returnValue = "";
    dialog.showModal();
    // The evidence loads beside the question, never in front of it: a slow report must not
    // hold back an operator who confirms (or cancels) at once.
    this.showEvidence(box);
    return answer;
  }

  async showEvidence(box) {
    try {
      const [state, report] = await Promise.all([this.api.rollout(this.ref), this.api.report(this.ref)]);
      const last = (state.decisions || [])[state.decisions.length - 1];
      box.innerHTML = `<p>stage <b>${esc(state.stage_percent ?? "—")}%</b>, status <b>${esc(state.status)}</b></p>
        ${report.rollout ? renderLook(report.rollout) : ""}
        ${last ? `<p>last decision: <b>${esc(last.decision)}</b> — ${esc(last.reason || "")} ${summary(last.evidence || {})}</p>
          ${renderEvidence(last.evidence || {}, "/confirm/evidence")}` : `<p class="muted">No decisions yet.</p>`}`;
    } catch (err) {
      box.innerHTML = `<p class="bad-text">Evidence unavailable: ${esc(err.message)}</p>`;
    }
  }

  async onSubmit(ev) {
    if (ev.target.id !== "weights-form") return;
    ev.preventDefault();
    const inputs = [...ev.target.querySelectorAll("input[data-variant]")];
    const weights = Object.fromEntries(inputs.map((i) => [i.dataset.variant, Number(i.value)]));
    const variants = this.exp.variants.map((v) => ({ ...v, weight: weights[v.name] }));
    await this.run("weights", () => act("PATCH", `/admin/experiments/${q(this.ref)}`, { variants }));
  }
}
