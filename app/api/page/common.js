// The control page's shared helpers: the state it shows, building elements, the admin key,
// numbers in words, messages and the admin actions. Plain JS, no build: the page's other
// scripts (bars.js, backends.js, panels.js, page.js) are loaded after this one.
"use strict";

const KEY = "microscheduler.adminKey";
const PALETTE = ["#2563eb", "#7c3aed", "#0d9488", "#db2777", "#ca8a04", "#0891b2", "#65a30d", "#c2410c"];
// `received`: when the backends section last came (performance.now()), for countdowns;
// `skew`: the gateway's clock less this browser's (s), for times the gateway gives as dates.
// `result`: the last action's result and its place (see showResult).
const state = { status: null, events: [], retry: null, controller: null, live: false, received: 0, skew: 0,
  result: null, resultTimer: null };

const $ = (selector) => document.querySelector(selector);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

function headers(extra = {}) {
  const key = sessionStorage.getItem(KEY);
  return key ? { ...extra, authorization: `Bearer ${key}` } : extra;
}

function colorOf(name) {
  const names = (state.status?.backends || []).map((b) => b.name);
  const index = Math.max(0, names.indexOf(name));
  return PALETTE[index % PALETTE.length];
}

const known = (n) => n !== null && n !== undefined;
const mib = (n) => (known(n) ? `${Number(n).toLocaleString("en")} MiB` : "-");
const gib = (n) => `${(n / 1024).toFixed(1)} GiB`;
const clock = (unix) => new Date(unix * 1000).toLocaleTimeString();
const gatewayNow = () => Date.now() / 1000 + state.skew;

function when(unix) {
  // A moment in the browser's time zone: the time today, with the weekday (and the date
  // beyond a week) on another day.
  const date = new Date(unix * 1000);
  const days = Math.abs(unix - gatewayNow()) / 86400;
  if (date.toDateString() === new Date().toDateString()) return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const options = days < 6 ? { weekday: "short", hour: "2-digit", minute: "2-digit" }
    : { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" };
  return date.toLocaleString([], options);
}
const pct = (part, whole) => `${(100 * part) / (whole || 1)}%`;

function duration(seconds) {
  // "42 s", "3 min 5 s", "2 h 10 min".
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// -- messages -----------------------------------------------------------------------------

function say(text, kind = "error") {
  const close = el("button", { text: "dismiss", onclick: () => box.remove() });
  const box = el("div", { class: `msg ${kind}` }, el("span", { text }), close);
  $("#messages").prepend(box);
  if (kind === "info") setTimeout(() => box.remove(), 6000);
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body?.error?.message) return body.error.message;
  } catch (_) { /* not JSON */ }
  return `HTTP ${response.status} ${response.statusText}`;
}

// -- action results -----------------------------------------------------------------------
// An action's result shows where its button was (`place`: "backend:NAME", "yield",
// "host:NAME", "zones", "profile"), in that place's slot, once: the next action's result
// replaces it wherever it was, and a success fades. The slots are drawn with each render
// (`resultSlot`), so a status update keeps the result where it is.

const RESULT_FADE_MS = 8000;

function resultNode(place) {
  const r = state.result;
  if (!r || r.place !== place) return null;
  return el("p", { class: `result ${r.kind}`, role: r.kind === "error" ? "alert" : "status",
    "data-field": "result", "data-kind": r.kind },
  el("span", { text: r.text }),
  el("button", { class: "dismiss", text: "dismiss", "aria-label": "dismiss this result",
    onclick: () => showResult(null) }));
}

function resultSlot(place) {
  return el("div", { class: "result-slot", "data-result-slot": place }, resultNode(place));
}

function showResult(place, text, kind = "info") {
  clearTimeout(state.resultTimer);
  state.result = place === null ? null : { place, text, kind };
  let shown = false;
  for (const node of document.querySelectorAll("[data-result-slot]")) {
    const child = resultNode(node.dataset.resultSlot);
    node.replaceChildren(...(child ? [child] : []));
    shown = shown || Boolean(child);
  }
  if (place === null) return;
  if (!shown) { // its place is gone (a card removed by a reload): say it at the top
    state.result = null;
    say(text, kind);
    return;
  }
  if (kind === "info") state.resultTimer = setTimeout(() => showResult(null), RESULT_FADE_MS);
}

// -- actions ------------------------------------------------------------------------------

async function act(label, method, path, body, { place, done } = {}) {
  // While it runs, the page's other actions wait (those that could apply: a button
  // disabled for a reason stays disabled). Its result, or why it failed, shows in `place`
  // (`done(answer)`: the words for a success; else "LABEL: done").
  const buttons = [...document.querySelectorAll("main button:not(:disabled)")];
  buttons.forEach((b) => { b.disabled = true; });
  const tell = (text, kind) => (place ? showResult(place, text, kind) : say(text, kind));
  try {
    const response = await fetch(path, {
      method,
      headers: headers(body === undefined ? {} : { "content-type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      askForKey();
      tell(`${label}: ${await errorText(response)}`, "error");
      return null;
    }
    if (!response.ok) {
      tell(`${label} failed: ${await errorText(response)}`, "error");
      return null;
    }
    const answer = await response.json();
    tell(done ? done(answer) : `${label}: done`, "info");
    return answer;
  } catch (err) {
    tell(`${label}: the gateway did not answer (${err.message})`, "error");
    return null;
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

function askForKey() {
  $("#key-form").hidden = false;
  $("#key-input").focus();
  if (state.live) return;
  // Nothing the gateway holds is known without the key: say so where the yield's state
  // shows (not "no yield", which would be a guess).
  const label = $("#yield-state");
  label.textContent = "unknown: the admin key is needed to see or change the yield";
  label.className = "muted";
}
