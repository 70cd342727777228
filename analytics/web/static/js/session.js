// Who is signed in, and the one way the dashboard changes anything: the control plane's
// /admin API, with the session's CSRF token in X-CSRF-Token (the cookie alone is refused).

const TIMEOUT_MS = 15000;
let mePromise = null;

export class ActionError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// GET /admin/me: {name, role, actor, csrf}; null when it cannot be read.
export function me() {
  if (!mePromise) {
    mePromise = fetch("/admin/me", { headers: { Accept: "application/json" } })
      .then((res) => (res.ok ? res.json() : null))
      .catch(() => null);
  }
  return mePromise;
}

const RANK = { viewer: 0, operator: 1, admin: 2 };
export function may(who, role) {
  return Boolean(who) && RANK[who.role] >= RANK[role];
}

// A change through /admin: JSON in, JSON out; a refusal raises ActionError with the
// service's reason (the same words the API and the CLI show).
export async function act(method, path, body) {
  const who = await me();
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), TIMEOUT_MS);
  try {
    const res = await fetch(path, {
      method,
      signal: ctrl.signal,
      headers: {
        Accept: "application/json",
        "Content-Type": "application/json",
        "X-CSRF-Token": (who && who.csrf) || "",
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!res.ok) {
      const detail = data && typeof data.detail === "string" ? data.detail : res.statusText;
      throw new ActionError(res.status, `${res.status} ${detail}`);
    }
    return data;
  } catch (err) {
    if (err instanceof ActionError) throw err;
    throw new ActionError(0, err.name === "AbortError" ? "request timed out" : "service unreachable");
  } finally {
    clearTimeout(timer);
  }
}

// The top bar: who is signed in, their role, and a sign-out form carrying the CSRF token.
export async function renderWho(el) {
  const who = await me();
  if (!who || !el) return;
  const form = document.createElement("form");
  form.method = "post";
  form.action = "/dashboard/logout";
  form.className = "signout";
  form.innerHTML = `<input type="hidden" name="csrf"><button type="submit" class="link">sign out</button>`;
  form.querySelector("input").value = who.csrf || "";
  el.textContent = "";
  const name = document.createElement("span");
  name.id = "who-name";
  name.textContent = `${who.name} · ${who.role}`;
  el.append(name);
  if (may(who, "operator")) {
    const link = document.createElement("a");
    link.href = "/dashboard/new";
    link.id = "new-experiment-link";
    link.textContent = "new experiment";
    el.append(link);
  }
  if (may(who, "operator")) {
    const link = document.createElement("a");
    link.href = "/dashboard/admin";
    link.id = "admin-link";
    link.textContent = "settings";
    el.append(link);
  }
  if (who.csrf) el.append(form);
}
