// The control page's shared helpers: the state it shows, building elements, the admin key,
// numbers in words, messages and the admin actions. Plain JS, no build: the page's other
// scripts (bars.js, backends.js, panels.js, page.js) are loaded after this one.
"use strict";

const KEY = "microscheduler.adminKey";
const PALETTE = ["#2563eb", "#7c3aed", "#0d9488", "#db2777", "#ca8a04", "#0891b2", "#65a30d", "#c2410c"];
// `received`: when the backends section last came (performance.now()), for countdowns;
// `skew`: the gateway's clock less this browser's (s), for times the gateway gives as dates.
const state = { status: null, events: [], retry: null, controller: null, live: false, received: 0, skew: 0 };

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

// -- actions ------------------------------------------------------------------------------

async function act(label, method, path, body) {
  // While it runs, the page's other actions wait (those that could apply: a button
  // disabled for a reason stays disabled).
  const buttons = [...document.querySelectorAll("main button:not(:disabled)")];
  buttons.forEach((b) => { b.disabled = true; });
  try {
    const response = await fetch(path, {
      method,
      headers: headers(body === undefined ? {} : { "content-type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      askForKey();
      say(`${label}: ${await errorText(response)}`);
      return null;
    }
    if (!response.ok) {
      say(`${label} failed: ${await errorText(response)}`);
      return null;
    }
    const answer = await response.json();
    say(`${label}: done`, "info");
    return answer;
  } catch (err) {
    say(`${label}: the gateway did not answer (${err.message})`);
    return null;
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

function askForKey() {
  $("#key-form").hidden = false;
  $("#key-input").focus();
}
