// The report API, as the dashboard reads it. Every request has a deadline so a hung
// server shows up as a stale banner instead of a page that silently stops updating.

import { me } from "./session.js";

const BASE = document.body.dataset.api || "/api";
const TIMEOUT_MS = 10000;

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function getJSON(path) {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), TIMEOUT_MS);
  try {
    const res = await fetch(BASE + path, { signal: ctrl.signal, headers: { Accept: "application/json" } });
    if (res.status === 401) {
      // No (or an expired) session: sign in, then come back to this page.
      location.assign(`/dashboard/login?next=${encodeURIComponent(location.pathname)}`);
    }
    if (!res.ok) {
      let detail = res.statusText;
      try {
        const body = await res.json();
        detail = typeof body.detail === "string" ? body.detail : detail;
      } catch {
        // not JSON: keep the status text
      }
      throw new ApiError(res.status, `${res.status} ${detail}`);
    }
    return await res.json();
  } catch (err) {
    if (err instanceof ApiError) throw err;
    throw new ApiError(0, err.name === "AbortError" ? "request timed out" : "service unreachable");
  } finally {
    clearTimeout(timer);
  }
}

// A change (the admin API): sent with the page's credentials, and with the CSRF token when
// the page is signed in (the session's token from /admin/me). A 401/403 is shown, not
// redirected: a viewer's session may look but not act.
async function postJSON(url) {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), 3 * TIMEOUT_MS);
  const csrf = (await me())?.csrf;
  try {
    const res = await fetch(url, {
      method: "POST",
      signal: ctrl.signal,
      credentials: "same-origin",
      headers: { Accept: "application/json", ...(csrf ? { "X-CSRF-Token": csrf } : {}) },
    });
    let body = null;
    try {
      body = await res.json();
    } catch {
      // not JSON
    }
    if (!res.ok) {
      const detail = body && typeof body.detail === "string" ? body.detail : res.statusText;
      throw new ApiError(res.status, `${res.status} ${detail}`);
    }
    return body;
  } catch (err) {
    if (err instanceof ApiError) throw err;
    throw new ApiError(0, err.name === "AbortError" ? "request timed out" : "service unreachable");
  } finally {
    clearTimeout(timer);
  }
}

export const api = {
  experiments: () => getJSON("/experiments"),
  report: (ref) => getJSON(`/experiments/${encodeURIComponent(ref)}/report`),
  rollout: (ref) => getJSON(`/experiments/${encodeURIComponent(ref)}/rollout`),
  examples: (ref, params) => getJSON(`/experiments/${encodeURIComponent(ref)}/examples?${new URLSearchParams(params)}`),
  shadowPairs: (ref, params) => getJSON(`/experiments/${encodeURIComponent(ref)}/shadow-pairs?${new URLSearchParams(params)}`),
  offlineGate: (ref, items, offset) =>
    getJSON(`/experiments/${encodeURIComponent(ref)}/offline-gate?items=${items}&offset=${offset}`),
  webhooks: () => getJSON("/notifications/webhooks"),
  deliveries: (limit) => getJSON(`/notifications/deliveries?limit=${limit}`),
  testWebhook: (name) => postJSON(`/admin/webhooks/${encodeURIComponent(name)}/test`),
};
