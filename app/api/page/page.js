// The control page: follows GET /status/stream and calls the admin API. Plain JS, no build.
// The stream is read with fetch (EventSource cannot send the admin key as a bearer token).
// Helpers are in common.js, the bars in bars.js, the backend cards in backends.js, the
// logs panel and the activity view in panels.js.
"use strict";

function yieldNow(host) {
  // The local host's GPU unless `host` names another; the options are the yield section's.
  // The gateway gives the verdict (an ask it could not meet is undone and refused, as
  // `microscheduler yield` shows it); the page shows it where the button was.
  const body = {
    reason: "control page",
    include_pinned: $('[data-field="include-pinned"]').checked,
  };
  const ttl = ttlSeconds();
  if (ttl > 0) body.ttl_s = ttl;
  const minFree = $('[data-field="min-free"]').value;
  if (minFree !== "") body.min_free_mib = Number(minFree);
  if (host) body.host = host;
  return act(host ? `Yield ${host}` : "Yield", "POST", "/vram/yield", body,
    { place: host ? `host:${host}` : "yield", done: yielded });
}

function yielded(y) {
  // The answer to a yield, in words: what it took and freed, and until when it holds.
  const took = [...y.stopped.map((n) => `stopped ${n}`), ...y.slept.map((n) => `${n} asleep`)];
  const freed = known(y.freed_mib) ? `freed ${mib(y.freed_mib)}, ` : "";
  const until = y.expires_at ? `until ${clock(y.expires_at)}` : "no expiry: held until restored";
  // Already held: this call added its own hold (each holder holds the yield on its own).
  const held = y.already ? `Already yielded (held by ${(y.holders || [y.reason]).join(", ")})` : "Yielded";
  return `${held}: ${freed}${mib(y.free_mib)} free`
    + `${took.length ? ` (${took.join(", ")})` : ""}; ${until}`;
}

function ttlSeconds() {
  // The TTL field: empty or 0 means no expiry (the yield holds until restored).
  const value = Number($('[data-field="ttl"]').value);
  return Number.isFinite(value) && value > 0 ? value : 0;
}

function renderTtlNote() {
  const ttl = ttlSeconds();
  $('[data-field="ttl-note"]').textContent = ttl > 0
    ? `restores by itself after ${duration(ttl)}` : "no expiry: held until you restore";
}

function restore(host) {
  const place = { place: host ? `host:${host}` : "yield",
    done: (r) => (r.restored ? `Restored${host ? ` ${host}` : ""}: the models may use the GPU`
      : "No yield was held: nothing to restore") };
  return host ? act(`Restore ${host}`, "POST", "/vram/restore", { host }, place)
    : act("Restore", "POST", "/vram/restore", undefined, place);
}

// -- the stream ---------------------------------------------------------------------------

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
  state.live = true;
  startActivity();
  startUsage();
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
  state.live = false;
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
  if (event === "snapshot" || event === "backends") state.received = performance.now();
  if (event === "snapshot") {
    state.status = payload;
    state.skew = payload.gateway.started_at + payload.gateway.uptime_s - Date.now() / 1000;
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
  const persisted = s.state?.persisted !== false;
  $("#persisted").hidden = persisted;
  if (!persisted) $("#persisted").textContent = `state not saved: ${s.state.error || "retrying"}`;
  renderProbeWarning();
  renderGpus();
  renderHolds();
  renderBackends();
  renderProfile();
  renderSchedules();
  renderConfig();
  renderFallback();
  renderKeys();
  renderEvents();
}

// `gpu.probe: auto` found no GPU (or `auto` on another host): no admission, said loudly.
function renderProbeWarning() {
  const warnings = (state.status.hosts || [])
    .filter((host) => host.gpu?.warning)
    .map((host) => manyHosts() ? `${host.name}: ${host.gpu.warning}` : host.gpu.warning);
  const banner = $("#probe-warning");
  banner.hidden = warnings.length === 0;
  banner.replaceChildren(...warnings.map((w) => el("p", { text: `No GPU probe: ${w}` })));
}

// More than one machine (models.yaml `hosts:`): the GPUs and the backends say which.
const manyHosts = () => (state.status.hosts || []).length > 1;

function renderGpus() {
  // One machine: its GPUs and RAM. More: each host under a heading (probe, state, yield, zones).
  const box = $("#gpus");
  const s = state.status;
  if (!manyHosts()) {
    box.replaceChildren(machine(s.hosts?.[0]?.name || "local", s.gpu, s.holds, s.host_ram));
    return;
  }
  box.replaceChildren(...s.hosts.map((host) => el("div", { class: "host", "data-testid": `host-${host.name}` },
    hostHead(host), machine(host.name, host.gpu, host.holds, host.host_ram))));
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
      onclick: () => act(`Release zone ${z.zone}`, "POST", `/vram/zones/${encodeURIComponent(z.zone)}/release`,
        undefined, { place: `host:${host.name}` }) })));
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
        title: "with the options of the VRAM yield section", onclick: () => yieldNow(host.name) }),
    resultSlot(`host:${host.name}`));
}

function yieldText(y) {
  const until = y.expires_at ? ` until ${clock(y.expires_at)}` : "";
  const freed = y.freed_mib === null || y.freed_mib === undefined ? "" : `, freed ${mib(y.freed_mib)}`;
  // Every holder: the yield ends when the last one lets go (the Restore button: all).
  return `yielded (${(y.holders || [y.reason]).join(", ")})${freed}, ${mib(y.free_mib)} free${until}`;
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
        onclick: () => act(`Release zone ${z.zone}`, "POST", `/vram/zones/${encodeURIComponent(z.zone)}/release`,
          undefined, { place: "zones" }) })));
  }
}

function renderProfile() {
  const active = state.status.profile.active;
  if (active || !$("#profile-select").hidden) $("#profile-active").textContent = active || "none";
}

const ACTION = { yield: "yields the GPU", profile: "switches the GPU profile", keep_warm: "keeps a backend warm" };

function renderSchedules() {
  // Each window (models.yaml `schedules:`): active or not, its next edge in the browser's
  // time and counting down, and whether a person undid it (until that edge).
  const list = $("#schedules");
  const windows = state.status.schedules || [];
  if (!windows.length) {
    list.replaceChildren(el("li", { class: "muted", text: "none (models.yaml schedules:)" }));
    return;
  }
  list.replaceChildren(...windows.map((w) => {
    const left = w.next_edge_at - gatewayNow();
    return el("li", { class: w.active ? "window active" : "window", "data-schedule": w.name,
      "data-active": String(w.active) },
    el("div", { class: "window-head" },
      el("b", { text: w.name }),
      el("span", { class: w.active ? "pill live" : "pill", "data-field": "schedule-state",
        text: w.active ? "active" : "inactive" }),
      w.overridden ? el("span", { class: "pill overridden", "data-field": "overridden",
        title: "a person undid what it puts in force: it applies again at its next edge",
        text: "overridden until next edge" }) : null),
    el("div", { class: "muted", text: ACTION[w.action] || w.action }),
    el("div", { "data-field": "next-edge", "data-at": w.next_edge_at },
      `${w.active ? "ends" : "starts"} ${when(w.next_edge_at)} · `,
      el("span", { "data-until": w.next_edge_at, text: left > 0 ? `in ${duration(left)}` : "now" })));
  }));
}

function renderConfig() {
  // The configuration running: its files' hash, when and how it was (re)loaded, what a
  // reload could not apply, and the last reload refused.
  const c = state.status.config;
  if (!c) return;
  const loaded = c.source === "startup" ? `loaded ${when(c.loaded_at)}` : `reloaded ${when(c.loaded_at)} (${c.source})`;
  const refused = c.last_refused;
  $("#config").replaceChildren(...[
    el("span", { class: "muted", title: `the YAML files of ${c.directory}` }, "config ",
      el("code", { "data-field": "config-hash", text: c.hash }), ` · ${loaded}`),
    c.restart_required.length ? el("span", { class: "pill warn", "data-field": "restart-required",
      text: `restart needed for ${c.restart_required.join(", ")}` }) : null,
    refused ? el("span", { class: "pill down", "data-field": "reload-refused",
      title: refused.problems.join("\n"), text: `reload refused ${when(refused.at)}` }) : null,
  ].filter(Boolean));
}

function providerProblem(p) {
  // Why a provider is skipped (null: it can answer, as far as the gateway knows).
  if (!p.key_present) return `no key: ${p.api_key_env} is not set`;
  if (!p.active) return "not in use";
  return null;
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
      const provider = f.providers[entry];
      const problem = provider ? providerProblem(provider) : null;
      if (problem) return el("span", { class: "provider-off", "data-entry": entry, title: `skipped: ${problem}`,
        text: `${entry} (${problem.startsWith("no key") ? "no key" : "off"})` });
      const cls = circuit ? `circuit-${circuit.state}` : "";
      const note = circuit && circuit.state !== "closed" ? ` (${circuit.state.replace("_", "-")})` : "";
      return el("span", { class: cls, "data-entry": entry, text: entry + note });
    });
    const arrowed = entries.flatMap((e, i) => (i ? [" → ", e] : [e]));
    box.append(el("div", { class: "row chain" }, el("b", { text: `${key}:` }), ...arrowed),
      el("div", { class: "muted", text: `models: ${chain.models.join(", ")}` }));
  }
  const providers = Object.entries(f.providers);
  if (providers.length) {
    box.append(el("h3", { text: "Providers" }), el("ul", { class: "providers" }, providers.map(([name, p]) => {
      const problem = providerProblem(p);
      return el("li", { "data-provider": name },
        el("b", { text: name }), ` ${p.kind}, ${p.model} `,
        el("span", { class: problem ? "pill down" : "pill live", "data-field": "provider-state",
          text: problem || (p.api_key_env ? "key set" : "no key needed") }));
    })));
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
      el("td", { "data-label": "key" }, el("b", { text: k.name })),
      el("td", { "data-label": "prio", text: k.priority }),
      el("td", { "data-label": "models", text: k.models ? k.models.join(", ") : "all" }),
      el("td", { "data-label": "cloud", text: k.cloud ? "yes" : "no" }),
      el("td", { "data-label": "in flight", class: "num", text: used(k.in_flight, k.max_concurrent) }),
      el("td", { "data-label": "requests / min", class: "num", text: used(k.requests_last_minute, k.rpm) }),
      el("td", { "data-label": "tokens / min", class: "num", text: used(k.tokens_last_minute, k.tpm) }),
      el("td", { "data-label": "cloud tokens today", class: "num",
        text: used(k.cloud_tokens_today, k.daily_cloud_tokens) }),
      el("td", { "data-label": "served", class: "num", text: String(k.requests.served) }),
      el("td", { "data-label": "refused", class: refused.length || forbidden ? "num limited" : "num",
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
  if (name) act(`Activate profile ${name}`, "POST", `/profiles/${encodeURIComponent(name)}/activate`,
    undefined, { place: "profile" });
});
$('[data-field="ttl"]').addEventListener("input", renderTtlNote);
renderTtlNote();
$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("#key-input").value.trim());
  $("#key-form").hidden = true;
  follow();
  loadProfiles();
});

$('[data-field="activity-model"]').addEventListener("change", loadActivity);
$('[data-field="activity-key"]').addEventListener("change", loadActivity);
setInterval(tick, 1000);

follow();
loadProfiles();
