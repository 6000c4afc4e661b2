// A backend's output in a panel (GET /backends/{name}/logs?follow=1, read as it comes;
// closing the panel ends the request), the activity view (GET /activity) and the usage
// per key (GET /usage/summary), both polled while the live status is and the page is
// visible. All send the admin key as the page's other calls do.
"use strict";

const LOG_TAIL = 200;
const LOG_KEEP = 2000; // lines kept in the panel
const ACTIVITY_LIMIT = 50;
const ACTIVITY_EVERY_MS = 3000;
const USAGE_EVERY_MS = 3000;
const logs = new Map(); // backend name -> {panel, controller}

function openLogs(name) {
  const open = logs.get(name);
  if (open) {
    open.panel.querySelector('[data-action="close-logs"]').focus();
    return;
  }
  const controller = new AbortController();
  const text = el("pre", { class: "log-text", "data-field": "log", tabindex: 0 });
  const note = el("span", { class: "muted", "data-field": "log-state", text: "connecting…" });
  const close = el("button", { "data-action": "close-logs", text: "close", onclick: () => closeLogs(name) });
  const panel = el("div", { class: "logs", role: "dialog", "aria-label": `output of ${name}`,
    "data-testid": `logs-${name}`, onkeydown: (e) => { if (e.key === "Escape") closeLogs(name); } },
  el("div", { class: "logs-head" }, el("b", { text: `${name}: output` }), note, close), text);
  $("#panels").append(panel);
  logs.set(name, { panel, controller });
  close.focus();
  followLogs(name, controller, text, note);
}

function closeLogs(name) {
  const open = logs.get(name);
  if (!open) return;
  logs.delete(name);
  open.controller.abort();
  open.panel.remove();
}

function overwritten(line) {
  // A progress bar redrawn with "\r" (tqdm): what a terminal would show, its last state.
  const parts = line.split("\r").filter((part) => part !== "");
  return parts.length ? parts[parts.length - 1] : "";
}

async function followLogs(name, controller, text, note) {
  const path = `/backends/${encodeURIComponent(name)}/logs?tail=${LOG_TAIL}&follow=1`;
  const lines = [];
  let partial = "";
  const show = () => {
    const atEnd = text.scrollTop + text.clientHeight >= text.scrollHeight - 4;
    text.textContent = [...lines, overwritten(partial)].join("\n");
    if (atEnd) text.scrollTop = text.scrollHeight;
  };
  try {
    const response = await fetch(path, { headers: headers(), signal: controller.signal });
    if (!response.ok) {
      note.textContent = `refused: ${await errorText(response)}`;
      return;
    }
    note.textContent = "following";
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const chunk = (partial + decoder.decode(value, { stream: true })).split("\n");
      partial = chunk.pop();
      lines.push(...chunk.map(overwritten));
      lines.splice(0, Math.max(0, lines.length - LOG_KEEP));
      show();
    }
    note.textContent = "ended (the server's output closed)";
  } catch (err) {
    if (!controller.signal.aborted) note.textContent = `the gateway did not answer (${err.message})`;
  }
}

// -- activity -----------------------------------------------------------------------------

const activity = { timer: null, busy: false };

async function loadActivity() {
  if (!state.live || activity.busy || document.hidden) return;
  activity.busy = true;
  const query = new URLSearchParams({ limit: String(ACTIVITY_LIMIT) });
  const model = $('[data-field="activity-model"]').value.trim();
  const key = $('[data-field="activity-key"]').value.trim();
  if (model) query.set("model", model);
  if (key) query.set("key", key);
  try {
    const response = await fetch(`/activity?${query}`, { headers: headers() });
    if (!response.ok) {
      $("#activity-note").textContent = `(refused: ${await errorText(response)})`;
      return;
    }
    const body = await response.json();
    $("#activity-note").textContent = `· last ${body.entries.length} of ${body.held} kept`;
    renderActivity(body.entries);
  } catch (_) { /* the stream's state says the gateway is gone */ } finally {
    activity.busy = false;
  }
}

function cell(label, value, attrs = {}) {
  return el("td", { "data-label": label, ...attrs }, value);
}

function renderActivity(entries) {
  const body = $("#activity");
  if (!entries.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 11, class: "muted", text: "no requests yet" })));
    return;
  }
  body.replaceChildren(...entries.map((e) => {
    const tokens = known(e.prompt_tokens) || known(e.completion_tokens)
      ? `${e.prompt_tokens ?? "-"} → ${e.completion_tokens ?? "-"}` : "-";
    const wait = e.wait_reason === "none" ? "-" : `${e.wait_s.toFixed(2)} s (${e.wait_reason})`;
    return el("tr", { "data-model": e.model ?? "", "data-status": e.status },
      cell("time", clock(e.at)),
      cell("key", e.key ?? "-"),
      cell("model", e.model ?? "-"),
      cell("route", e.route ?? "-"),
      cell("api", e.api),
      // A response that broke after its status line: the status that went out, and why.
      cell("status", e.stream_error ? `${e.status} (${e.stream_error})` : String(e.status),
        { class: e.status >= 400 || e.stream_error ? "bad num" : "num" }),
      cell("tokens", tokens, { class: "num" }),
      cell("tok/s", known(e.tokens_per_s) ? String(e.tokens_per_s) : "-", { class: "num" }),
      cell("wait", wait, { class: "num" }),
      cell("fallbacks", String(e.fallbacks), { class: "num" }),
      cell("duration", `${e.duration_s.toFixed(2)} s`, { class: "num" }));
  }));
}

function startActivity() {
  clearInterval(activity.timer);
  activity.timer = setInterval(loadActivity, ACTIVITY_EVERY_MS);
  loadActivity();
}

// -- usage per key ------------------------------------------------------------------------

const usage = { timer: null, busy: false };

async function loadUsage() {
  if (!state.live || usage.busy || document.hidden) return;
  usage.busy = true;
  try {
    const response = await fetch("/usage/summary", { headers: headers() });
    if (!response.ok) {
      $("#usage-note").textContent = `(refused: ${await errorText(response)})`;
      return;
    }
    const body = await response.json();
    $("#usage-note").replaceChildren("· UTC days, today ", el("span", { class: "nowrap", text: body.today }));
    renderUsage(body.keys);
  } catch (_) { /* the stream's state says the gateway is gone */ } finally {
    usage.busy = false;
  }
}

const tokens = (n) => Number(n).toLocaleString("en");

function costText(view) {
  // The estimate from the providers' cost_per_mtok; "-" when nothing priced was used.
  if (!view.cloud_tokens || (!view.cost && !view.cost_complete)) return "-";
  const cost = view.cost >= 1 ? view.cost.toFixed(2)
    : view.cost.toLocaleString("en", { maximumSignificantDigits: 2 });
  return view.cost_complete ? cost : `${cost} + unpriced`;
}

function usageCells(span, view) {
  const unpriced = view.cloud_tokens && !view.cost_complete
    ? "a provider used has no cost_per_mtok: its tokens are not in the estimate" : null;
  return [
    cell(`${span} local tokens`, tokens(view.local_tokens), { class: "num", "data-field": `${span}-local` }),
    cell(`${span} cloud tokens`, tokens(view.cloud_tokens), { class: "num", "data-field": `${span}-cloud` }),
    cell(`${span} cost (est.)`, costText(view), { class: "num", "data-field": `${span}-cost`, title: unpriced }),
  ];
}

function renderUsage(keys) {
  const body = $("#usage");
  if (!keys.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 7, class: "muted", text: "no requests in the last 7 days" })));
    return;
  }
  body.replaceChildren(...keys.map((k) => el("tr", { "data-key": k.key },
    cell("key", el("b", { text: k.key === "-" ? "no key" : k.key })),
    ...usageCells("today", k.today),
    ...usageCells("7 days", k.last_7_days))));
}

function startUsage() {
  clearInterval(usage.timer);
  usage.timer = setInterval(loadUsage, USAGE_EVERY_MS);
  loadUsage();
}
