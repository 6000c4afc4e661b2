// The control page: follows GET /status/stream and calls the admin API. Plain JS, no build.
// The stream is read with fetch (EventSource cannot send the admin key as a bearer token).
"use strict";

const KEY = "microscheduler.adminKey";
const PALETTE = ["#2563eb", "#7c3aed", "#0d9488", "#db2777", "#ca8a04", "#0891b2", "#65a30d", "#c2410c"];
const state = { status: null, events: [], retry: null, controller: null };

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
    if (child !== null && child !== undefined) node.append(child);
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

const mib = (n) => (n === null || n === undefined ? "-" : `${Number(n).toLocaleString("en")} MiB`);
const gib = (n) => `${(n / 1024).toFixed(1)} GiB`;
const clock = (unix) => new Date(unix * 1000).toLocaleTimeString();

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
  const buttons = document.querySelectorAll("button");
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

function yieldNow(host) {
  // The local host's GPU unless `host` names another; the options are the yield section's.
  const body = {
    reason: "control page",
    include_pinned: $('[data-field="include-pinned"]').checked,
  };
  const ttl = Number($('[data-field="ttl"]').value);
  if (ttl > 0) body.ttl_s = ttl;
  const minFree = $('[data-field="min-free"]').value;
  if (minFree !== "") body.min_free_mib = Number(minFree);
  if (host) body.host = host;
  return act(host ? `Yield ${host}` : "Yield", "POST", "/vram/yield", body);
}

function restore(host) {
  return host ? act(`Restore ${host}`, "POST", "/vram/restore", { host }) : act("Restore", "POST", "/vram/restore");
}

// -- the stream ---------------------------------------------------------------------------

function askForKey() {
  $("#key-form").hidden = false;
  $("#key-input").focus();
}

function connection(text, kind) {
  const pill = $("#connection");
  pill.textContent = text;
  pill.className = `pill ${kind || ""}`;
}

function reconnect(delay) {
  clearTimeout(state.retry);
  state.retry = setTimeout(follow, delay);
}

async function follow() {
  if (state.controller) state.controller.abort();
  const controller = new AbortController();
  state.controller = controller;
  let response;
  try {
    response = await fetch("/status/stream", { headers: headers(), signal: controller.signal });
  } catch (err) {
    connection("gateway unreachable, retrying", "down");
    return reconnect(2000);
  }
  if (response.status === 401) {
    connection("admin key needed", "down");
    return askForKey();
  }
  if (!response.ok) {
    connection(`refused: ${await errorText(response)}`, "down");
    return;
  }
  connection("live", "live");
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        handle(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  } catch (err) {
    if (controller.signal.aborted) return;
  }
  connection("disconnected, reconnecting", "down");
  reconnect(1000);
}

function handle(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue; // keep-alive
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  if (!data.length) return;
  const payload = JSON.parse(data.join("\n"));
  if (event === "snapshot") {
    state.status = payload;
    state.events = [...payload.events].reverse();
    render();
  } else if (event === "event") {
    if (!state.events.some((e) => e.seq === payload.seq)) state.events.unshift(payload);
    state.events.length = Math.min(state.events.length, 100);
    renderEvents();
  } else if (event === "dropped") {
    say("The live view fell behind and was restarted.", "info");
  } else if (state.status && event in state.status) {
    state.status[event] = payload;
    render();
  }
}

// -- rendering ----------------------------------------------------------------------------

function render() {
  if (!state.status) return;
  const s = state.status;
  $("#uptime").textContent = `up since ${clock(s.gateway.started_at)}`;
  renderGpus();
  renderHolds();
  renderBackends();
  renderProfile();
  renderFallback();
  renderKeys();
  renderEvents();
}

// More than one machine (models.yaml `hosts:`): the GPUs and the backends say which.
const manyHosts = () => (state.status.hosts || []).length > 1;

function holdingOn(host, gpu) {
  // Backends holding memory on this host's GPU: measured by the probe where it measured, else placed.
  return state.status.backends
    .filter((b) => b.holds_vram && b.host === host && b.gpus.includes(gpu))
    .map((b) => ({ name: b.name, mib: b.vram.measured_mib ?? b.vram.admission_mib ?? 0,
                   measured: b.vram.measured_mib !== null && b.vram.measured_mib !== undefined }));
}

function renderGpus() {
  // One machine: its GPUs. More: each host under a heading (probe, state, yield, zones).
  const box = $("#gpus");
  box.replaceChildren();
  if (!manyHosts()) {
    box.append(...gpuBars("local", state.status.gpu, state.status.holds));
    return;
  }
  for (const host of state.status.hosts) {
    box.append(el("div", { class: "host", "data-testid": `host-${host.name}` },
      hostHead(host), ...gpuBars(host.name, host.gpu, host.holds)));
  }
}

function hostHead(host) {
  const gpu = host.gpu;
  const age = gpu.age_s === null || gpu.age_s === undefined ? "" : `, ${Math.round(gpu.age_s)} s old`;
  const probe = host.probe === "none" ? ["off", "off"]
    : !gpu.up ? ["down", `down: ${gpu.error || "no sample yet"}`]
    : gpu.stale ? ["stale", `stale${age}`] : ["up", "up"];
  const y = host.holds.yield;
  const yielded = y.state === "yielded";
  const zones = host.holds.zones.map((z) => el("span", { class: "zone", "data-zone": z.zone },
    `zone ${z.zone}: ${mib(z.mib)} on GPU ${z.gpu} for ${z.holder} `,
    el("button", { "data-action": "release-zone", "data-zone": z.zone, text: "release",
      onclick: () => act(`Release zone ${z.zone}`, "POST", `/vram/zones/${encodeURIComponent(z.zone)}/release`) })));
  return el("div", { class: "host-head" },
    el("b", { text: host.name }),
    el("span", { class: "muted", text: `probe ${host.probe}` }),
    el("span", { class: `pill probe-${probe[0]}`, "data-field": "probe-state", text: probe[1] }),
    el("span", { class: yielded ? "held" : "muted", "data-field": "yield", text: yielded ? yieldText(y) : "no yield" }),
    ...zones,
    yielded
      ? el("button", { "data-action": "restore-host", "data-host": host.name, text: "restore",
        onclick: () => restore(host.name) })
      : el("button", { "data-action": "yield-host", "data-host": host.name, text: "yield",
        title: "with the options of the VRAM yield section", onclick: () => yieldNow(host.name) }));
}

function gpuBars(host, gpu, holds) {
  // A bar per GPU of `host`: its backends, other processes, zones and the yield, free memory.
  if (!gpu.gpus.length) {
    const why = gpu.source === "none" ? "no GPU telemetry (gpu.probe: none)" : (gpu.error || "no GPU sample yet");
    return [el("p", { class: "muted", text: why })];
  }
  const bars = [];
  for (const g of gpu.gpus) {
    const total = g.total_mib || 1;
    const holders = holdingOn(host, g.index);
    const mine = holders.reduce((sum, h) => sum + h.mib, 0);
    const others = Math.max(0, g.used_mib - mine);
    const held = [...holds.zones.filter((z) => z.gpu === g.index)
      .map((z) => ({ label: `zone ${z.zone} (${z.holder})`, mib: z.mib }))];
    if (holds.yield.state === "yielded" && holds.yield.gpu === g.index) {
      held.push({ label: `yield: ${holds.yield.reason}`, mib: holds.yield.held_mib });
    }
    let free = Math.max(0, g.free_mib);
    const bar = el("div", { class: "bar" });
    for (const h of holders) {
      bar.append(el("div", {
        class: "seg", "data-segment": h.name, title: `${h.name}: ${mib(h.mib)} ${h.measured ? "measured" : "placed"}`,
        style: `width:${(100 * h.mib) / total}%;background:${colorOf(h.name)}`,
      }, h.mib / total > 0.08 ? h.name : ""));
    }
    if (others > 0) {
      bar.append(el("div", { class: "seg other", "data-segment-kind": "other", title: `other processes: ${mib(others)}`,
        style: `width:${(100 * others) / total}%` }, others / total > 0.08 ? "other" : ""));
    }
    for (const h of held) {
      const shown = Math.min(h.mib, free);
      free -= shown;
      if (shown <= 0) continue;
      bar.append(el("div", { class: "seg hold", "data-segment-kind": "hold", title: `${h.label}: ${mib(h.mib)} held`,
        style: `width:${(100 * shown) / total}%` }, shown / total > 0.1 ? h.label : ""));
    }
    const legend = el("div", { class: "legend" },
      holders.map((h) => el("span", {}, el("i", { style: `background:${colorOf(h.name)}` }),
        `${h.name} ${mib(h.mib)}${h.measured ? "" : " (placed)"}`)),
      el("span", {}, el("i", { style: "background:var(--other)" }), `other ${mib(others)}`),
      held.length ? el("span", {}, el("i", { class: "seg hold" }), `held ${mib(held.reduce((a, h) => a + h.mib, 0))}`) : null,
      el("span", {}, el("i", { style: "background:var(--free)" }), `free ${mib(g.free_mib)}`));
    bars.push(el("div", { class: "gpu", "data-testid": `gpu-${g.index}` },
      el("div", { class: "gpu-head" },
        el("b", { text: `GPU ${g.index}: ${g.name}` }),
        el("span", { text: `${gib(g.used_mib)} used of ${gib(g.total_mib)}${gpu.stale ? " (stale)" : ""}` })),
      bar, legend));
  }
  return bars;
}

function yieldText(y) {
  const until = y.expires_at ? ` until ${clock(y.expires_at)}` : "";
  const freed = y.freed_mib === null || y.freed_mib === undefined ? "" : `, freed ${mib(y.freed_mib)}`;
  return `yielded (${y.reason})${freed}, ${mib(y.free_mib)} free${until}`;
}

function renderHolds() {
  const y = state.status.holds.yield;
  const label = $("#yield-state");
  $("#gaming-host").hidden = !manyHosts();
  if (y.state === "yielded") {
    label.textContent = yieldText(y);
    label.className = "held";
  } else {
    label.textContent = "no yield: the models may use the GPU";
    label.className = "";
  }
  const zones = $("#zones");
  zones.replaceChildren();
  const list = state.status.holds.zones;
  if (!list.length) zones.append(el("li", { class: "muted", text: "none" }));
  for (const z of list) {
    zones.append(el("li", {},
      `${z.zone}: ${mib(z.mib)} on GPU ${z.gpu} for ${z.holder}`,
      z.expires_at ? ` until ${clock(z.expires_at)} ` : " ",
      el("button", { "data-action": "release-zone", "data-zone": z.zone, text: "release",
        onclick: () => act(`Release zone ${z.zone}`, "POST", `/vram/zones/${encodeURIComponent(z.zone)}/release`) })));
  }
}

function renderBackends() {
  const body = $("#backends");
  body.replaceChildren();
  const many = manyHosts();
  $('th[data-column="host"]').hidden = !many;
  for (const b of state.status.backends) {
    const planned = b.vram.footprint ? b.vram.footprint.mib : b.vram.admission_mib;
    const resident = b.protected_for_s ? `resident ${Math.ceil(b.protected_for_s)}s more (min_resident_s)` : null;
    const asleep = b.state === "sleeping" && b.asleep_mib ? `keeps ${mib(b.asleep_mib)} asleep` : null;
    const why = [b.starting, b.reason, asleep, resident, ...b.blocked_by, b.health_error]
      .filter(Boolean).join("; ");
    const path = `/backends/${encodeURIComponent(b.name)}`;
    const actions = el("div", { class: "actions" },
      el("button", { "data-action": "start", text: b.state === "sleeping" ? "wake" : "start",
        onclick: () => act(`Start ${b.name}`, "POST", `${path}/start`) }),
      el("button", { "data-action": "stop", text: "stop",
        onclick: () => act(`Stop ${b.name}`, "POST", `${path}/stop`) }),
      b.yield_method === "sleep"
        ? el("button", { "data-action": "sleep", text: "sleep",
          onclick: () => act(`Sleep ${b.name}`, "POST", `${path}/sleep`) })
        : null);
    body.append(el("tr", { "data-testid": `backend-${b.name}` },
      el("td", {}, el("b", { text: b.name }),
        el("div", { class: "muted apis", "data-field": "apis", title: "the APIs it serves",
          text: b.apis.join(" · ") })),
      many ? el("td", { "data-field": "host", text: b.host ?? "cluster",
        title: b.host ? "the machine whose GPUs it uses" : "a kubernetes backend the cluster places" }) : null,
      el("td", {}, el("span", { class: `state state-${b.state}`, "data-field": "state", text: b.state })),
      el("td", { text: b.lifecycle }),
      el("td", { class: "num", text: String(b.priority) }),
      el("td", { class: "num", "data-field": "in-flight",
        text: b.max_inflight ? `${b.in_flight} / ${b.max_inflight}` : String(b.in_flight) }),
      el("td", { class: "num", "data-field": "waiting",
        title: "held: for a wake, or queued for a slot (max_inflight) · waiting for a free connection (max_connections)",
        text: waitingText(b) }),
      el("td", { class: "num", text: `${mib(planned)} / ${mib(b.vram.measured_mib)}` }),
      el("td", { class: "num", text: b.last_start_s === null ? "-" : `${b.last_start_s.toFixed(1)} s` }),
      el("td", { "data-field": "why", text: why }),
      el("td", {}, actions)));
  }
}

function waitingText(b) {
  // "3", "3 (2 queued)", "3 + 1 pool": held requests, those queued for a slot, the pool's.
  let text = String(b.waiting);
  if (b.queued) text += ` (${b.queued} queued)`;
  if (b.pool_waiting) text += ` + ${b.pool_waiting} pool`;
  return text;
}

function renderProfile() {
  const active = state.status.profile.active;
  if (active || !$("#profile-select").hidden) $("#profile-active").textContent = active || "none";
}

function renderFallback() {
  const box = $("#fallback");
  const f = state.status.fallback;
  box.replaceChildren();
  const chains = Object.entries(f.chains);
  if (!chains.length) {
    box.append(el("p", { class: "muted", text: "no fallback chains (cloud_providers.yaml)" }));
    return;
  }
  for (const [key, chain] of chains) {
    const entries = chain.entries.map((entry) => {
      const circuit = f.circuits[entry];
      const cls = circuit ? `circuit-${circuit.state}` : "";
      const note = circuit && circuit.state !== "closed" ? ` (${circuit.state.replace("_", "-")})` : "";
      return el("span", { class: cls, text: entry + note });
    });
    const arrowed = entries.flatMap((e, i) => (i ? [" → ", e] : [e]));
    box.append(el("div", { class: "row" }, el("b", { text: `${key}:` }), ...arrowed,
      el("span", { class: "muted", text: `models: ${chain.models.join(", ")}` })));
  }
}

function used(now, limit) {
  // "12 / 600", or just the count when the key has no such limit.
  if (now === null || now === undefined) return limit ? `- / ${limit}` : "-";
  return limit === null || limit === undefined ? String(now) : `${now} / ${limit}`;
}

function renderKeys() {
  const body = $("#keys");
  const keys = state.status.keys || [];
  body.replaceChildren(...keys.map((k) => {
    const refused = Object.entries(k.limited).filter(([, n]) => n > 0);
    const limits = refused.map(([limit, n]) => `${limit} ${n}`).join(", ");
    const forbidden = k.requests.forbidden ? `, model not allowed ${k.requests.forbidden}` : "";
    return el("tr", { "data-key": k.name },
      el("td", {}, el("b", { text: k.name })),
      el("td", { text: k.priority }),
      el("td", { text: k.models ? k.models.join(", ") : "all" }),
      el("td", { text: k.cloud ? "yes" : "no" }),
      el("td", { class: "num", text: used(k.in_flight, k.max_concurrent) }),
      el("td", { class: "num", text: used(k.requests_last_minute, k.rpm) }),
      el("td", { class: "num", text: used(k.tokens_last_minute, k.tpm) }),
      el("td", { class: "num", text: used(k.cloud_tokens_today, k.daily_cloud_tokens) }),
      el("td", { class: "num", text: String(k.requests.served) }),
      el("td", { class: refused.length || forbidden ? "num limited" : "num",
                 text: (limits || "0") + forbidden }));
  }));
}

function summary(event) {
  const skip = new Set(["seq", "at", "kind"]);
  return Object.entries(event).filter(([k, v]) => !skip.has(k) && v !== null && v !== "")
    .map(([k, v]) => `${k}=${Array.isArray(v) ? v.join(",") || "-" : typeof v === "object" ? JSON.stringify(v) : v}`)
    .join(" ");
}

function renderEvents() {
  const list = $("#events");
  list.replaceChildren(...state.events.map((e) =>
    el("li", {}, el("time", { text: clock(e.at) }), el("b", { text: e.kind }), ` ${summary(e)}`)));
}

async function loadProfiles() {
  try {
    const response = await fetch("/profiles", { headers: headers() });
    if (!response.ok) return;
    const body = await response.json();
    const select = $("#profile-select");
    select.replaceChildren(...(body.profiles || []).map((p) => el("option", { value: p.name, text: p.name })));
    const none = !select.options.length;
    select.hidden = none;
    $('[data-action="activate-profile"]').hidden = none;
    if (none) $("#profile-active").textContent = "none (no gpu_profiles.yaml)";
  } catch (_) { /* shown by the stream's state */ }
}

// -- wiring -------------------------------------------------------------------------------

$('[data-action="yield"]').addEventListener("click", () => yieldNow());
$('[data-action="restore"]').addEventListener("click", () => restore());
$('[data-action="activate-profile"]').addEventListener("click", () => {
  const name = $("#profile-select").value;
  if (name) act(`Activate profile ${name}`, "POST", `/profiles/${encodeURIComponent(name)}/activate`);
});
$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("#key-input").value.trim());
  $("#key-form").hidden = true;
  follow();
  loadProfiles();
});

follow();
loadProfiles();
