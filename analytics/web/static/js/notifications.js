// The notifications page: webhooks (GET /api/notifications/webhooks) with a test button each
// (POST /admin/webhooks/{name}/test, admin only), and the delivery log
// (GET /api/notifications/deliveries). Changes are made with `liftgate webhooks` or the admin API.

import { esc, when } from "./format.js";

const LOG_ROWS = 50;
const TONE = { delivered: "good", failed: "bad", pending: "warn" };

export class NotificationsPage {
  constructor(root) {
    this.root = root;
    this.api = null;
    document.title = "liftgate — notifications";
    root.innerHTML = `
      <section class="card">
        <h1>Webhooks</h1>
        <table class="grid" id="webhooks">
          <thead><tr><th>name</th><th>url</th><th>format</th><th>signed</th><th>events</th><th>test</th></tr></thead>
          <tbody></tbody>
        </table>
        <p class="empty" id="no-webhooks" hidden>No webhooks yet. Add one with
          <code>liftgate webhooks add URL --secret … --events rollout.rollback,guardrail.failed</code>.</p>
        <p class="test-result" id="test-result" aria-live="polite"></p>
      </section>
      <section class="card">
        <h2>Delivery log</h2>
        <table class="grid" id="deliveries">
          <thead><tr>
            <th>queued</th><th>webhook</th><th>event</th><th>type</th><th>status</th>
            <th class="r">attempts</th><th>last answer</th><th class="r">latency</th><th>next attempt</th>
          </tr></thead>
          <tbody></tbody>
        </table>
        <p class="empty" id="no-deliveries" hidden>Nothing sent yet.</p>
      </section>`;
    root.querySelector("#webhooks").addEventListener("click", (ev) => {
      const button = ev.target.closest("button[data-test]");
      if (button) this.test(button);
    });
  }

  async test(button) {
    const name = button.dataset.test;
    const out = this.root.querySelector("#test-result");
    button.disabled = true;
    out.className = "test-result";
    out.textContent = `sending a test notification to ${name}…`;
    try {
      const d = await this.api.testWebhook(name);
      const ok = d.status === "delivered";
      out.className = `test-result ${ok ? "good" : "bad"}`;
      out.dataset.status = d.status;
      out.textContent = ok
        ? `${name}: delivered ${d.event_id} (HTTP ${d.last_status}, ${Math.round(d.latency_ms)} ms)`
        : `${name}: not delivered — ${d.last_error}`;
    } catch (err) {
      out.className = "test-result bad";
      out.dataset.status = "error";
      out.textContent =
        err.status === 401 || err.status === 403
          ? `${name}: sending a test needs an admin sign-in (${err.message})`
          : `${name}: ${err.message}`;
    } finally {
      button.disabled = false;
    }
    await this.refresh(this.api);
  }

  async refresh(api) {
    this.api = api;
    const [hooks, log] = await Promise.all([api.webhooks(), api.deliveries(LOG_ROWS)]);
    this.root.querySelector("#webhooks tbody").innerHTML = hooks
      .map(
        (h) => `<tr data-webhook="${esc(h.name)}">
          <td>${esc(h.name)}</td><td><code>${esc(h.url)}</code></td><td>${esc(h.format)}</td>
          <td>${h.signed ? "yes" : "no"}</td><td>${h.events.map((e) => `<code>${esc(e)}</code>`).join(" ")}</td>
          <td><button type="button" class="btn" data-test="${esc(h.name)}">Send test</button></td>
        </tr>`,
      )
      .join("");
    this.root.querySelector("#no-webhooks").hidden = hooks.length > 0;
    this.root.querySelector("#deliveries tbody").innerHTML = log
      .map(
        (d) => `<tr data-delivery="${d.id}" data-status="${esc(d.status)}">
          <td>${when(d.created_at)}</td><td>${esc(d.webhook)}</td><td><code>${esc(d.event_id)}</code></td>
          <td><code>${esc(d.type)}</code></td>
          <td><span class="badge ${TONE[d.status] ?? "neutral"}">${esc(d.status)}</span></td>
          <td class="r">${d.attempts}</td>
          <td>${esc(d.last_error ?? (d.last_status ? `HTTP ${d.last_status}` : "—"))}</td>
          <td class="r">${d.latency_ms == null ? "—" : `${Math.round(d.latency_ms)} ms`}</td>
          <td>${d.next_attempt_at ? when(d.next_attempt_at) : "—"}</td>
        </tr>`,
      )
      .join("");
    this.root.querySelector("#no-deliveries").hidden = log.length > 0;
  }
}
