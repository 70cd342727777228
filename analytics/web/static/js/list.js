// The experiments list: one row per experiment from GET /api/experiments.

import { cell, esc, when } from "./format.js";
import { badge, statusBadge } from "./verdicts.js";

export class ListPage {
  constructor(root) {
    this.root = root;
    document.title = "liftgate — experiments";
    root.innerHTML = `
      <section class="card">
        <h1>Experiments</h1>
        <table class="grid" id="experiments">
          <thead><tr>
            <th>experiment</th><th>route</th><th>mode</th><th>status</th><th class="r">stage</th>
            <th class="r">units</th><th>verdict</th><th>started</th><th>report</th>
          </tr></thead>
          <tbody></tbody>
        </table>
        <p class="empty" hidden>No experiments yet. Create one with <code>liftgate experiments create FILE.yaml</code>
          or <code>POST /admin/experiments</code>.</p>
      </section>`;
  }

  async refresh(api) {
    const rows = await api.experiments();
    const body = this.root.querySelector("#experiments tbody");
    body.innerHTML = rows
      .map((e, i) => {
        const href = `/dashboard/experiments/${encodeURIComponent(e.name)}`;
        return `<tr data-experiment="${esc(e.name)}" data-src="list">
          <td><a href="${href}">${esc(e.name)}</a></td>
          <td><code>${esc(e.route)}</code></td>
          <td>${esc(e.mode)}</td>
          <td>${statusBadge(e.status)}</td>
          <td class="r">${e.stage_percent == null ? "—" : `${cell(e.stage_percent, "num", `/${i}/stage_percent`)}%`}</td>
          <td class="r">${cell(e.units, "count", `/${i}/units`)}</td>
          <td>${badge(e.verdict)}</td>
          <td>${when(e.started_at)}</td>
          <td>${when(e.report_at)}</td>
        </tr>`;
      })
      .join("");
    this.root.querySelector(".empty").hidden = rows.length > 0;
  }
}
