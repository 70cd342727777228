// Entry point: pick the page from the URL, then poll the report API and redraw in place.
// ?refresh=SECONDS changes the poll period (default 5 s; 0 turns polling off).

import { api, ApiError } from "./api.js";
import { ExamplesPage, ShadowPairsPage } from "./examples.js";
import { ExperimentPage } from "./experiment.js";
import { clock, esc } from "./format.js";
import { ActionsCard } from "./actions.js";
import { AdminPage } from "./admin.js";
import { CreatePage } from "./create.js";
import { ListPage } from "./list.js";
import { NotificationsPage } from "./notifications.js";
import { OfflineGatePage } from "./offline_gate.js";
import { renderWho } from "./session.js";

const params = new URLSearchParams(location.search);
const PERIOD_MS = Math.max(0, Number(params.get("refresh") ?? 5)) * 1000 || 0;
// Settings and the new-experiment form change only when someone acts: no polling there.

const root = document.getElementById("app");
const status = document.getElementById("refresh-status");
const crumbs = document.getElementById("crumbs");

const match = location.pathname.match(/^\/dashboard\/experiments\/([^/]+)(\/offline-gate|\/examples|\/shadow-pairs)?\/?$/);
const ref = match ? decodeURIComponent(match[1]) : null;
const sub = match && match[2] ? match[2].slice(1) : null;
const SUBPAGES = {
  "offline-gate": [OfflineGatePage, "offline gate"],
  examples: [ExamplesPage, "examples"],
  "shadow-pairs": [ShadowPairsPage, "shadow pairs"],
};
const special = {
  "/dashboard/new": ["new experiment", CreatePage],
  "/dashboard/admin": ["settings", AdminPage],
  "/dashboard/notifications": ["notifications", NotificationsPage, true], // its delivery log moves
};
const own = special[location.pathname.replace(/\/$/, "")];
const polls = !own || own[2] === true;
const page = own
  ? new own[1](root)
  : !ref
    ? new ListPage(root)
    : sub
      ? new SUBPAGES[sub][0](root, ref)
      : new ExperimentPage(root, ref);
const home = `<a href="/dashboard">experiments</a>`;
const expLink = `<a href="/dashboard/experiments/${encodeURIComponent(ref ?? "")}">${esc(ref)}</a>`;
crumbs.innerHTML = own
  ? `${home} / <span>${own[0]}</span>`
  : !ref
    ? `<span>experiments</span> · <a href="/dashboard/notifications">notifications</a>`
    : sub
      ? `${home} / ${expLink} / <span>${SUBPAGES[sub][1]}</span>`
      : `${home} / <span>${esc(ref)}</span>`;

// The actions of an experiment page (operators and admins; drawn once, redrawn after each action).
const actions = ref && !sub ? new ActionsCard(root.querySelector("#head"), ref, api) : null;
renderWho(document.getElementById("who"));

// Exposed for the browser test and for debugging from the console.
window.liftgate = { page, actions, refreshes: 0, lastError: null };
if (actions) actions.load().catch((err) => (window.liftgate.lastError = err.message));

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
    status.textContent = `updated ${clock(Date.now())}` + (PERIOD_MS && polls ? ` · every ${PERIOD_MS / 1000}s` : "");
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
  if (PERIOD_MS && polls && !document.hidden) timer = setTimeout(tick, PERIOD_MS);
}

// Background tabs stop polling; coming back refreshes at once.
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && timer === null && PERIOD_MS && polls) tick();
});

tick();
