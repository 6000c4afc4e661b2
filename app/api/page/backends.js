// The backends, one card each: state, load progress while starting, what it holds, its
// queue and idle countdown (saying whether it sleeps or stops), why it is as it is, and its
// actions. An action that cannot apply is disabled, its reason in the button's title and,
// on small screens, in words when the state beside its name does not say it already. An
// action's result shows in its card (common.js showResult).
"use strict";

function actions(b) {
  // [{action, text, why (null: it can apply), run}] for backend `b`. Load and unload are
  // the client verbs (POST /models/load, /models/unload, by the backend's name): unload
  // drains, then does what its idle method says (`idle.action`). Beside it, the release
  // it does not do: sleep (when the server offers it) and stop (when unload may sleep).
  const path = `/backends/${encodeURIComponent(b.name)}`;
  const place = { place: `backend:${b.name}` };
  const model = { model: b.name };
  // A load or unload says the model's state after it (`status.value`: loaded, sleeping...).
  const said = (verb) => ({ ...place, done: (a) => `${verb} ${b.name}: ${a.status?.value ?? "done"}` });
  const external = b.managed ? null : "not managed by the gateway (an external server, only checked)";
  const blocked = b.blocked_by.length ? `blocked by ${b.blocked_by.join("; ")}` : null;
  const idle = b.idle?.action || "stop";
  // Reasons that only repeat the state shown beside the name (`obvious`): in the button's
  // title, not in words under every card on a phone.
  const loadWhy = external
    || (b.state === "ready" ? "already ready"
      : b.state === "starting" ? "starting already"
        : b.state === "stopping" ? "stopping: load it once it stopped" : null)
    || blocked;
  const unloadWhy = external
    || (b.state === "stopped" ? "already stopped" : b.state === "stopping" ? "stopping already"
      : b.state === "sleeping" && idle === "sleep" ? "already asleep" : null);
  const stopWhy = external
    || (b.state === "stopped" ? "already stopped" : b.state === "stopping" ? "stopping already" : null);
  const list = [
    { action: "load", text: b.state === "sleeping" ? "wake" : "load", why: loadWhy,
      obvious: loadWhy === "already ready" || loadWhy === "starting already",
      run: () => act(`Load ${b.name}`, "POST", "/models/load", model, said("Load")) },
    { action: "unload", text: "unload", why: unloadWhy,
      obvious: ["already stopped", "stopping already", "already asleep"].includes(unloadWhy),
      run: () => act(`Unload ${b.name} (${idle})`, "POST", "/models/unload", model, said("Unload")) },
  ];
  if (b.sleep_mode || b.yield_method === "sleep") {
    const stateWhy = b.state === "sleeping" ? "already asleep"
      : b.state !== "ready" ? `only a ready backend sleeps (${b.state})` : null;
    const sleepWhy = external || (!b.sleep_mode ? "its server does not offer sleep mode" : null) || stateWhy;
    if (idle !== "sleep") {
      list.push({ action: "sleep", text: "sleep", why: sleepWhy, obvious: sleepWhy === stateWhy,
        run: () => act(`Sleep ${b.name}`, "POST", `${path}/sleep`, undefined, place) });
    }
  }
  if (idle !== "stop") {
    list.push({ action: "stop", text: "stop", why: stopWhy,
      obvious: stopWhy === "already stopped" || stopWhy === "stopping already",
      run: () => act(`Stop ${b.name}`, "POST", `${path}/stop`, undefined, place) });
  }
  list.push({ action: "logs", text: "logs",
    why: b.output ? null : "no output the gateway can read (it does not run this server)",
    run: () => openLogs(b.name) });
  return list;
}

function loadBar(b) {
  // While starting: vLLM's phase, the share done (a moving bar when not known), time left.
  // Before its launch (waiting_for_vram, waiting_for_turn): what it waits for, in words.
  const load = b.load;
  if (b.state !== "starting" && !load) return null;
  const share = load && known(load.percent) ? Math.max(0, Math.min(100, load.percent)) : null;
  const waiting = load && load.phase.startsWith("waiting_for") && b.starting;
  const words = [waiting || (load ? load.phase.replaceAll("_", " ") : (b.starting || "starting")),
    share === null ? null : `${Math.round(share)}%`,
    load && known(load.eta_s) ? `about ${duration(load.eta_s)} left` : null].filter(Boolean).join(" · ");
  return el("div", { class: "load", "data-testid": `load-${b.name}`, "data-percent": share ?? "" },
    el("div", { class: "load-text", text: words }),
    el("div", { class: share === null ? "progress unknown" : "progress", role: "progressbar",
      "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": share ?? false },
    el("i", { style: share === null ? "" : `width:${share}%` })));
}

function countdown(field, seconds, label) {
  // Counts down between updates of the status (tick() below).
  return el("span", { "data-field": field, "data-countdown": seconds, "data-label": label },
    `${label} ${duration(seconds)}`);
}

function fact(name, ...value) {
  return el("div", { class: "fact" }, el("span", { class: "muted", text: name }), el("span", {}, ...value));
}

function gpusFact(b) {
  // Where it sits: the GPUs it holds now ("0,1"); stopped, where it ran last; the why
  // (placed_why: "GPU 1: 18.2 GiB free, pack") as the title.
  const chosen = !Array.isArray(b.placement);
  const held = b.gpus ?? [];
  let text = held.join(",");
  if (!held.length) text = b.last_gpus ? `last ${b.last_gpus.join(",")}` : (chosen ? "at its start" : "-");
  const title = b.placed_why ? `${chosen ? `gpus: ${b.placement ?? "cluster"}: ` : ""}${b.placed_why}` : "";
  return fact("GPUs", el("span", { "data-field": "gpus", title, text }));
}

function placedLine(b) {
  // A backend placed at each start says why it went there, on the card (a title is not
  // seen on a phone); one with a gpus: list needs no words.
  if (Array.isArray(b.placement) || !(b.gpus ?? []).length || !b.placed_why) return null;
  return el("p", { class: "placed muted", "data-field": "placed-why", text: `placed: ${b.placed_why}` });
}

function backendCard(b, many) {
  const now = heldNow(b);
  const planned = b.vram.footprint ? b.vram.footprint.mib : b.vram.admission_mib;
  const resident = b.protected_for_s ? `resident ${Math.ceil(b.protected_for_s)} s more (min_resident_s)` : null;
  const why = [b.reason, resident, ...b.blocked_by.map((x) => `blocked by ${x}`), b.health_error].filter(Boolean).join("; ");
  const list = actions(b);
  const disabled = list.filter((a) => a.why && !a.obvious);
  // What the idle timer will do: `idle.action` (sleep, stop, or "sleep or stop").
  const idle = b.idle?.action || "stop";
  const timers = [
    known(b.idle_stop_in_s) ? countdown("idle-stop", b.idle_stop_in_s, `idle ${idle} in`) : null,
    known(b.restart_in_s) ? countdown("restart", b.restart_in_s, "restarts in") : null,
  ].filter(Boolean);
  return el("article", { class: "card", "data-testid": `backend-${b.name}` },
    el("div", { class: "card-head" },
      el("b", { class: "name", text: b.name }),
      el("span", { class: `state state-${b.state}`, "data-field": "state", text: b.state }),
      el("span", { class: "muted", text: `${b.lifecycle} · prio ${b.priority}` }),
      many ? el("span", { class: "pill", "data-field": "host", text: b.host ?? "cluster",
        title: b.host ? "the machine whose GPUs it uses" : "a kubernetes backend the cluster places" }) : null),
    el("div", { class: "muted apis", "data-field": "apis", title: `the APIs it serves (from ${b.apis_from})`,
      text: b.apis.join(" · ") }),
    loadBar(b),
    el("div", { class: "facts" },
      fact("holds now", el("span", { "data-field": "holds", "data-mib": now.mib, text: mib(now.mib) }),
        now.how === "none" ? "" : ` ${HOW[now.how]}`,
        now.how === "asleep" && b.asleep_level ? el("span", { class: "nowrap", text: ` (level ${b.asleep_level})` }) : ""),
      gpusFact(b),
      fact("planned / measured", `${mib(planned)} / ${mib(b.vram.measured_mib)}`),
      fact("in flight", el("span", { "data-field": "in-flight",
        text: b.max_inflight ? `${b.in_flight} / ${b.max_inflight}` : String(b.in_flight) })),
      fact("waiting", el("span", { "data-field": "waiting",
        title: "held: for a wake, or queued for a slot (max_inflight) · waiting for a free connection (max_connections)",
        text: waitingText(b) })),
      fact("queued", el("span", { "data-field": "queued", text: String(b.queued ?? 0) })),
      fact("last start", b.last_start_s === null ? "-" : `${b.last_start_s.toFixed(1)} s`),
      timers.length ? fact("timers", ...timers) : null),
    placedLine(b),
    why ? el("p", { class: "why", "data-field": "why", text: why }) : null,
    el("div", { class: "actions" }, list.map((a) => el("button", {
      "data-action": a.action, text: a.text, disabled: Boolean(a.why), title: a.why, onclick: a.run }))),
    disabled.length ? el("p", { class: "disabled-why", "data-field": "disabled-why",
      text: disabled.map((a) => `${a.text}: ${a.why}`).join(" · ") }) : null,
    resultSlot(`backend:${b.name}`));
}

function waitingText(b) {
  // "3", "3 (2 queued)", "3 + 1 pool": held requests, those queued for a slot, the pool's.
  let text = String(b.waiting);
  if (b.queued) text += ` (${b.queued} queued)`;
  if (b.pool_waiting) text += ` + ${b.pool_waiting} pool`;
  return text;
}

function renderBackends() {
  const many = manyHosts();
  $("#backends").replaceChildren(...state.status.backends.map((b) => backendCard(b, many)));
}

function tick() {
  // The countdowns, between two updates of the status.
  const elapsed = (performance.now() - state.received) / 1000;
  for (const node of document.querySelectorAll("[data-countdown]")) {
    const left = Number(node.dataset.countdown) - elapsed;
    node.textContent = left > 0 ? `${node.dataset.label} ${duration(left)}` : `${node.dataset.label} a moment`;
  }
  // Countdowns to a moment the gateway gave as a date (a schedule's next edge).
  const now = gatewayNow();
  for (const node of document.querySelectorAll("[data-until]")) {
    const left = Number(node.dataset.until) - now;
    node.textContent = left > 0 ? `in ${duration(left)}` : "now";
  }
}
