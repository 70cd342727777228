// The report API, as the dashboard reads it. Every request has a deadline so a hung
// server shows up as a stale banner instead of a page that silently stops updating.

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

export const api = {
  experiments: () => getJSON("/experiments"),
  report: (ref) => getJSON(`/experiments/${encodeURIComponent(ref)}/report`),
  rollout: (ref) => getJSON(`/experiments/${encodeURIComponent(ref)}/rollout`),
  offlineGate: (ref, items, offset) =>
    getJSON(`/experiments/${encodeURIComponent(ref)}/offline-gate?items=${items}&offset=${offset}`),
};
