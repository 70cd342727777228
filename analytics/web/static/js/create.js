// New experiment: pasted YAML (or the short form), checked as you type by the control
// plane itself (POST /admin/experiments/check runs the real create and rolls it back), so the
// reasons are the API's; "create" then posts the checked body to /admin/experiments.

import { esc } from "./format.js";
import { act } from "./session.js";

const EXAMPLE = `name: my-experiment
route: assistant
mode: ab
variants:
  - {name: baseline, upstream: UPSTREAM, model: MODEL, weight: 50, is_control: true}
  - {name: candidate, upstream: UPSTREAM, model: MODEL, weight: 50}
`;
const DEBOUNCE_MS = 300;

export class CreatePage {
  constructor(root) {
    this.root = root;
    this.checked = null;
    this.seq = 0;
    document.title = "liftgate — new experiment";
    root.innerHTML = `
      <section class="card" id="create-card">
        <h1>New experiment</h1>
        <div class="tabs"><button type="button" data-tab="yaml" class="on">YAML</button><button type="button" data-tab="form">form</button></div>
        <form id="form-mode" hidden class="grid-form">
          <label>name <input name="name" required></label>
          <label>route <input name="route" required></label>
          <label>mode <select name="mode"><option>ab</option><option>rollout</option><option>shadow</option></select></label>
          <label>baseline upstream <input name="b_upstream"></label><label>baseline model <input name="b_model"></label>
          <label>candidate upstream <input name="c_upstream"></label><label>candidate model <input name="c_model"></label>
          <label>candidate weight % <input name="c_weight" type="number" min="0" max="100" value="50"></label>
        </form>
        <textarea id="yaml" rows="14" spellcheck="false" aria-label="experiment YAML">${esc(EXAMPLE)}</textarea>
        <p id="check-result" role="status" class="muted">checking…</p>
        <button type="button" id="create" disabled>create (draft)</button>
        <p id="create-result" role="status"></p>
      </section>`;
    this.mode = "yaml";
    const yaml = root.querySelector("#yaml");
    const form = root.querySelector("#form-mode");
    yaml.addEventListener("input", () => this.schedule());
    form.addEventListener("input", () => this.schedule());
    root.querySelector(".tabs").addEventListener("click", (ev) => {
      const tab = ev.target.dataset.tab;
      if (!tab) return;
      this.mode = tab;
      form.hidden = tab !== "form";
      yaml.hidden = tab !== "yaml";
      root.querySelectorAll(".tabs button").forEach((b) => b.classList.toggle("on", b.dataset.tab === tab));
      this.schedule();
    });
    root.querySelector("#create").addEventListener("click", () => this.create());
    this.schedule();
  }

  body() {
    if (this.mode === "yaml") return { yaml: this.root.querySelector("#yaml").value };
    const f = Object.fromEntries(new FormData(this.root.querySelector("#form-mode")));
    const w = Number(f.c_weight);
    return {
      name: f.name,
      route: f.route,
      mode: f.mode,
      variants: [
        { name: "baseline", upstream: f.b_upstream, model: f.b_model, weight: 100 - w, is_control: true },
        { name: "candidate", upstream: f.c_upstream, model: f.c_model, weight: w },
      ],
    };
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.check(), DEBOUNCE_MS);
  }

  async check() {
    const seq = ++this.seq;
    const out = this.root.querySelector("#check-result");
    const button = this.root.querySelector("#create");
    try {
      const res = await act("POST", "/admin/experiments/check", this.body());
      if (seq !== this.seq) return; // a newer edit is being checked
      this.checked = res.body;
      out.className = "good-text";
      out.textContent = `valid: ${res.experiment.name} on route ${res.experiment.route} (${res.experiment.variants.length} variants)`;
      button.disabled = false;
    } catch (err) {
      if (seq !== this.seq) return;
      this.checked = null;
      out.className = "bad-text";
      out.textContent = err.message;
      button.disabled = true;
    }
  }

  async create() {
    const out = this.root.querySelector("#create-result");
    if (!this.checked) return;
    try {
      const made = await act("POST", "/admin/experiments", this.checked);
      out.className = "good-text";
      out.innerHTML = `created <a href="/dashboard/experiments/${encodeURIComponent(made.name)}">${esc(made.name)}</a> (draft)`;
    } catch (err) {
      out.className = "bad-text";
      out.textContent = err.message;
    }
  }

  async refresh() {}
}
