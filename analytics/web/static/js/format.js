// Display rules for every number on the dashboard (documented in docs/dashboard.md; the
// browser test re-implements them in Python and compares the page with the report API).
//
//   count  integers with thousands separators            1,234
//   pct    value × 100, one decimal, "%"                 50.0%
//   lift   like pct, with an explicit "+" when > 0       +3.2%   -1.0%   0.0%
//   p      "<0.001" below 0.001, else three decimals     0.042
//   num    |x| ≥ 1000: no decimals, separators           12,346
//          |x| ≥ 10: one decimal; |x| ≥ 1: two; else four decimals
//   diff   like num, with an explicit "+" when > 0
//   pts    pass-rate points: value × 100, one decimal, signed, " pts"   -28.3 pts
// Rounding is JavaScript's toFixed (half away from zero on the exact binary value).
// Missing values (null) are shown as an em dash.

export const DASH = "—";

function groups(text) {
  const neg = text.startsWith("-");
  const body = neg ? text.slice(1) : text;
  const [int, frac] = body.split(".");
  const withSep = int.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return (neg ? "-" : "") + withSep + (frac !== undefined ? "." + frac : "");
}

function signed(text) {
  // A value that rounds to zero is shown unsigned ("0.0%", never "-0.0%").
  if (/^-?[0,.]+$/.test(text)) return text.replace("-", "");
  return text.startsWith("-") ? text : "+" + text;
}

function isNum(x) {
  return typeof x === "number" && Number.isFinite(x);
}

export function count(x) {
  return isNum(x) ? groups(x.toFixed(0)) : DASH;
}

export function pct(x) {
  return isNum(x) ? (x * 100).toFixed(1).replace(/^-(0\.0)$/, "$1") + "%" : DASH;
}

export function lift(x) {
  return isNum(x) ? signed((x * 100).toFixed(1)) + "%" : DASH;
}

export function p(x) {
  if (!isNum(x)) return DASH;
  return x < 0.001 ? "<0.001" : x.toFixed(3);
}

export function num(x) {
  if (!isNum(x)) return DASH;
  const a = Math.abs(x);
  const digits = a >= 1000 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 4;
  const text = groups(x.toFixed(digits));
  return /^-[0,.]+$/.test(text) ? text.slice(1) : text;
}

export function diff(x) {
  return isNum(x) ? signed(num(x)) : DASH;
}

export function pts(x) {
  return isNum(x) ? signed((x * 100).toFixed(1)) + " pts" : DASH;
}

export const FORMATS = { count, pct, lift, p, num, diff, pts };

// A number cell: the shown text plus what the test needs to check it against the API
// (the raw value and the JSON pointer of its source field).
export function cell(value, fmt, pointer, extraClass = "") {
  const text = FORMATS[fmt](value);
  const raw = isNum(value) ? String(value) : "";
  const cls = ("num " + extraClass).trim();
  return `<span class="${cls}" data-fmt="${fmt}" data-ptr="${esc(pointer)}" data-raw="${raw}">${text}</span>`;
}

// RFC 6901: an object key inside a JSON pointer.
export function key(k) {
  return String(k).replaceAll("~", "~0").replaceAll("/", "~1");
}

export function esc(s) {
  return String(s ?? "")
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;");
}

export function when(iso) {
  if (!iso) return DASH;
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? DASH : d.toLocaleString("en-GB", { hour12: false });
}

export function clock(ms) {
  return new Date(ms).toLocaleTimeString("en-GB", { hour12: false });
}
