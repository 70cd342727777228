// Settings: upstreams, client API keys and users (admin role; an operator sees the
// upstreams and is refused the rest, with the service's reason).

import { esc, when } from "./format.js";
import { act } from "./session.js";

const q = encodeURIComponent;

// The settings lists: section id (its table, result line and card), admin API path, row.
const SECTIONS = [
  ["upstreams", "/admin/upstreams", (u) =>
    `<tr data-upstream="${esc(u.name)}"><td>${esc(u.name)}</td><td><code>${esc(u.base_url)}</code></td>
      <td>${esc(u.api_key || "—")}</td><td><button type="button" data-delete-upstream="${esc(u.name)}">delete</button></td></tr>`],
  ["keys", "/admin/api-keys", (k) =>
    `<tr data-key="${esc(k.name)}"><td>${esc(k.name)}</td><td><code>${esc(k.prefix)}…</code></td>
      <td>${k.revoked ? "revoked" : "active"}</td><td>${when(k.created_at)}</td>
      <td>${k.revoked ? "" : `<button type="button" data-revoke-key="${esc(k.name)}">revoke</button>`}</td></tr>`],
  ["users", "/admin/users", (u) =>
    `<tr data-user="${esc(u.name)}"><td>${esc(u.name)}</td><td>${esc(u.role)}</td><td>${u.disabled ? "disabled" : "active"}</td>
      <td><button type="button" data-toggle-user="${esc(u.name)}" data-disabled="${u.disabled}">${u.disabled ? "enable" : "disable"}</button></td></tr>`],
];

export class AdminPage {
  constructor(root) {
    this.root = root;
    document.title = "liftgate — settings";
    root.innerHTML = `
      <section class="card" id="upstreams-card"><h2>Upstreams</h2>
        <table class="grid compact" id="upstreams"><thead><tr><th>name</th><th>base URL</th><th>key</th><th></th></tr></thead><tbody></tbody></table>
        <form id="upstream-form" class="actions"><input name="name" placeholder="name" required>
          <input name="base_url" placeholder="https://host/v1" required size="30">
          <input name="api_key" type="password" placeholder="API key (optional)" autocomplete="off">
          <button type="submit">add upstream</button></form>
        <p class="muted" id="upstreams-result" role="status"></p></section>
      <section class="card" id="keys-card"><h2>Client API keys</h2>
        <table class="grid compact" id="keys"><thead><tr><th>name</th><th>prefix</th><th>status</th><th>created</th><th></th></tr></thead><tbody></tbody></table>
        <form id="key-form" class="actions"><input name="name" placeholder="key name" required><button type="submit">create key</button></form>
        <p class="muted" id="keys-result" role="status"></p></section>
      <section class="card" id="users-card"><h2>Users</h2>
        <table class="grid compact" id="users"><thead><tr><th>name</th><th>role</th><th>status</th><th></th></tr></thead><tbody></tbody></table>
        <form id="user-form" class="actions"><input name="name" placeholder="user name" required>
          <select name="role"><option>viewer</option><option>operator</option><option>admin</option></select>
          <input name="password" type="password" placeholder="password (12+ characters)" autocomplete="new-password" required>
          <button type="submit">add user</button></form>
        <p class="muted" id="users-result" role="status"></p></section>`;
    root.addEventListener("submit", (ev) => this.onSubmit(ev));
    root.addEventListener("click", (ev) => this.onClick(ev));
  }

  // A section whose list can't be read says why in its result line; after an action on it
  // (`after` names the section) the reason is added to the action's outcome, never written
  // over it: the outcome, and a new key shown once, stay on the page.
  async section(id, path, draw, after) {
    const result = this.root.querySelector(`#${id}-result`);
    try {
      this.root.querySelector(`#${id} tbody`).innerHTML = (await act("GET", path)).map(draw).join("");
    } catch (err) {
      result.className = "bad-text";
      if (after === id) result.append(` · list: ${err.message}`);
      else result.textContent = err.message;
    }
  }

  // Every section is listed once and refreshed the same way: none can miss the action's outcome.
  async refresh(after) {
    await Promise.all(SECTIONS.map(([id, path, draw]) => this.section(id, path, draw, after)));
  }

  async run(id, label, fn) {
    const result = this.root.querySelector(`#${id}-result`);
    try {
      const out = await fn();
      result.className = "good-text";
      result.textContent = `${label}: done`;
      if (out && out.key) {
        // The client key exists in clear only in this answer: shown once.
        result.innerHTML = `${esc(label)}: done — the key (shown once): <code id="new-key">${esc(out.key)}</code>`;
      }
    } catch (err) {
      result.className = "bad-text";
      result.textContent = `${label}: ${err.message}`;
    }
    await this.refresh(id);
  }

  onSubmit(ev) {
    ev.preventDefault();
    const f = Object.fromEntries(new FormData(ev.target));
    if (ev.target.id === "upstream-form") {
      const body = { name: f.name, base_url: f.base_url, ...(f.api_key ? { api_key: f.api_key } : {}) };
      this.run("upstreams", `add upstream ${f.name}`, () => act("POST", "/admin/upstreams", body));
    } else if (ev.target.id === "key-form") {
      this.run("keys", `create key ${f.name}`, () => act("POST", "/admin/api-keys", { name: f.name }));
    } else if (ev.target.id === "user-form") {
      this.run("users", `add user ${f.name}`, () => act("POST", "/admin/users", f));
    }
    ev.target.reset();
  }

  onClick(ev) {
    const b = ev.target.closest("button");
    if (!b) return;
    if (b.dataset.deleteUpstream) {
      const n = b.dataset.deleteUpstream;
      if (confirm(`Delete upstream ${n}?`)) this.run("upstreams", `delete ${n}`, () => act("DELETE", `/admin/upstreams/${q(n)}`));
    } else if (b.dataset.revokeKey) {
      const n = b.dataset.revokeKey;
      if (confirm(`Revoke key ${n}? Clients using it are refused at once.`)) {
        this.run("keys", `revoke ${n}`, () => act("DELETE", `/admin/api-keys/${q(n)}`));
      }
    } else if (b.dataset.toggleUser) {
      const n = b.dataset.toggleUser;
      const disabled = b.dataset.disabled !== "true";
      this.run("users", `${disabled ? "disable" : "enable"} ${n}`, () => act("PATCH", `/admin/users/${q(n)}`, { disabled }));
    }
  }
}
