// Entry point: pick the page from the URL, then poll the report API and redraw in place.
// ?refresh=SECONDS changes the poll period (default 5 s; 0 turns polling off).

import { api, ApiError } from "./api.js";
import { ExperimentPage } from "./experiment.js";
import { clock, esc } from "./format.js";
import { ListPage } from "./list.js";
import { OfflineGatePage } from "./offline_gate.js";

const params = new URLSearchParams(location.search);
const PERIOD_MS = Math.max(0, Number(params.get("refresh") ?? 5)) * 1000 || 0;

const root = document.getElementById("app");
const status = document.getElementById("refresh-status");
const crumbs = document.getElementById("crumbs");

const match = location.pathname.match(/^\/dashboard\/experiments\/([^/]+)(\/offline-gate)?\/?$/);
const ref = match ? decodeURIComponent(match[1]) : null;
const gate = Boolean(match && match[2]);
const page = !ref ? new ListPage(root) : gate ? new OfflineGatePage(root, ref) : new ExperimentPage(root, ref);
const home = `<a href="/dashboard">experiments</a>`;
const expLink = `<a href="/dashboard/experiments/${encodeURIComponent(ref ?? "")}">${esc(ref)}</a>`;
crumbs.innerHTML = !ref ? "<span>experiments</span>" : gate ? `${home} / ${expLink} / <span>offline gate</span>` : `${home} / <span>${esc(ref)}</span>`;

// Exposed for the browser test and for debugging from the console.
window.liftgate = { page, refreshes: 0, lastError: null };

let timer = null;
let inflight = false;
async function tick() {
  timer = null;
  if (inflight) return;
  inflight = true;
  try {
    await page.refresh(api);
    window.liftgate.refreshes += 1;
    window.liftgate.lastError = null;
    status.className = "status ok";
    status.textContent = `updated ${clock(Date.now())}` + (PERIOD_MS ? ` · every ${PERIOD_MS / 1000}s` : "");
  } catch (err) {
    // A rendering bug must reach the console (the browser test fails on it).
    if (!(err instanceof ApiError)) console.error(err);
    // API failures are shown in the page: a restarting service is expected, not a bug.
    window.liftgate.lastError = err.message;
    status.className = "status bad";
    status.textContent = `${err.status === 404 ? "not found" : "stale"}: ${err.message}`;
    if (err.status === 404 && ref) {
      root.querySelector("#head").innerHTML = `<h1>${esc(ref)}</h1><p>No such experiment (or no report yet).</p>`;
    }
  } finally {
    inflight = false;
  }
  if (PERIOD_MS && !document.hidden) timer = setTimeout(tick, PERIOD_MS);
}

// Background tabs stop polling; coming back refreshes at once.
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && timer === null && PERIOD_MS) tick();
});

tick();
