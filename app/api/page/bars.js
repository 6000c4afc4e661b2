// The GPU and host RAM bars. Each backend is drawn at what it holds now (asleep: what it
// keeps asleep; starting: its footprint as admitted; stopped: nothing); every segment
// carries the MiB it draws (`data-mib`), and a bar's segments never add up to more than
// its total: other processes' use is what the probe sees minus the backends'. The words
// beside a bar (headline, legend) are the bar's own numbers, never a second reading.
"use strict";

function heldNow(b) {
  // {mib, how}: what backend `b` holds on each of its GPUs now, and how that is known.
  if (!b.holds_vram) return { mib: 0, how: "none" };
  if (b.state === "sleeping") return { mib: b.asleep_mib ?? 0, how: "asleep" };
  if (b.state === "starting") return { mib: b.vram.admission_mib ?? 0, how: "starting" };
  if (known(b.vram.measured_mib)) return { mib: b.vram.measured_mib, how: "measured" };
  return { mib: b.vram.admission_mib ?? 0, how: "placed" };
}

function holdingOn(host, gpu) {
  return state.status.backends
    .filter((b) => b.holds_vram && b.host === host && b.gpus.includes(gpu))
    .map((b) => ({ name: b.name, awake: b.vram.admission_mib, ...heldNow(b) }));
}

function filler(total) {
  // Draws segments left to right within `total`: each is cut to what is left.
  let room = total;
  return (want) => {
    const drawn = Math.max(0, Math.min(Math.round(want), room));
    room -= drawn;
    return drawn;
  };
}

function segment(attrs, drawn, total, label, minShare = 0.08) {
  return el("div", { ...attrs, "data-mib": drawn, style: `width:${pct(drawn, total)};${attrs.style || ""}` },
    drawn / total > minShare ? label : "");
}

function legendItem(color, text, cls) {
  return el("span", {}, el("i", cls ? { class: cls } : { style: `background:${color}` }), text);
}

const HOW = { asleep: "asleep", starting: "starting, as admitted", measured: "measured", placed: "placed" };

function gpuBars(host, gpu, holds) {
  // A bar per GPU of `host`: its backends, other processes, zones and the yield, free memory.
  // The headline, the bar and the legend are one sum: what is drawn taken (backends as they
  // hold now, a start at what admission reserved for it, other processes) plus what the
  // holds keep plus free is the GPU's total. A start reserves its memory before its server
  // shows using it: that part is "reserved", not free, in the headline as in the bar.
  if (!gpu.gpus.length) {
    const why = gpu.source === "none" ? "no GPU telemetry (gpu.probe: none)" : (gpu.error || "no GPU sample yet");
    return [el("p", { class: "muted", text: why })];
  }
  return gpu.gpus.map((g) => {
    const total = g.total_mib || 1;
    const draw = filler(total);
    const holders = holdingOn(host, g.index);
    const mine = holders.reduce((sum, h) => sum + h.mib, 0);
    const others = Math.max(0, g.used_mib - mine);
    const held = holds.zones.filter((z) => z.gpu === g.index)
      .map((z) => ({ label: `zone ${z.zone} (${z.holder})`, mib: z.mib }));
    const y = holds.yield;
    if (y.state === "yielded" && y.gpu === g.index) {
      const freed = known(y.freed_mib) ? `, freed ${mib(y.freed_mib)}` : "";
      held.push({ label: `yield: ${y.reason}`, mib: y.held_mib, note: freed });
    }
    const bar = el("div", { class: "bar", "data-total-mib": total });
    let taken = 0;
    for (const h of holders) {
      if (h.mib <= 0) continue;
      h.drawn = draw(h.mib);
      taken += h.drawn;
      bar.append(segment({ class: `seg ${h.how}`, "data-segment": h.name,
        title: `${h.name}: ${mib(h.drawn)} ${HOW[h.how]}`, style: `background:${colorOf(h.name)}` },
      h.drawn, total, h.how === "asleep" ? `${h.name} (asleep)` : h.name));
    }
    const otherDrawn = draw(others);
    taken += otherDrawn;
    if (otherDrawn > 0) {
      bar.append(segment({ class: "seg other", "data-segment-kind": "other", title: `other processes: ${mib(otherDrawn)}` },
        otherDrawn, total, "other"));
    }
    // Reserved: admitted to a start (or placed) but not yet seen used by the probe.
    const reserved = Math.max(0, taken - g.used_mib);
    let free = total - taken; // what nothing takes: the holds keep part of it from models
    let kept = 0;
    for (const h of held) {
      h.drawn = draw(Math.min(h.mib, free));
      free -= h.drawn;
      kept += h.drawn;
      if (h.drawn <= 0) continue;
      bar.append(segment({ class: "seg hold", "data-segment-kind": "hold",
        title: `${h.label}: keeps ${mib(h.mib)} free of models` }, h.drawn, total, h.label, 0.1));
    }
    bar.dataset.takenMib = taken;
    bar.dataset.freeMib = free;
    const legend = el("div", { class: "legend" },
      holders.map((h) => legendItem(colorOf(h.name), h.how === "asleep"
        ? `${h.name} ${mib(h.drawn ?? h.mib)} asleep (${mib(h.awake)} awake)`
        : `${h.name} ${mib(h.drawn ?? h.mib)}${h.how === "measured" ? "" : ` (${HOW[h.how]})`}`)),
      legendItem("var(--other)", `other ${mib(otherDrawn)}`),
      held.map((h) => legendItem(null, `${h.label} keeps ${mib(h.drawn)} free${h.note || ""}`, "seg hold")),
      el("span", { "data-field": "free", "data-mib": free }, el("i", { style: "background:var(--free)" }),
        held.length ? `free, unheld ${mib(free)}` : `free ${mib(free)}`));
    const starting = holders.some((h) => h.how === "starting");
    const usedText = reserved <= 0 ? `${gib(taken)} used of ${gib(total)}`
      : `${gib(taken)} used or reserved of ${gib(total)} (${mib(reserved)} ${starting
        ? "reserved for a start, not in use yet" : "counted for backends, not seen used yet"})`;
    return el("div", { class: "gpu", "data-testid": `gpu-${g.index}` },
      el("div", { class: "bar-head" },
        el("b", { text: `GPU ${g.index}: ${g.name}` }),
        el("span", { "data-field": "used", "data-mib": taken, "data-reserved-mib": reserved,
          text: `${usedText}${gpu.stale ? " (stale)" : ""}` })),
      bar, legend);
  });
}

function ramBar(host, ram) {
  // The host's RAM: level-1 sleepers' charges (what their weights take in RAM), other use
  // (what the probe sees used, less the charges), available; a mark at the sleep budget.
  const box = el("div", { class: "ram", "data-testid": `ram-${host}` });
  const head = el("div", { class: "bar-head" }, el("b", { text: "Host RAM" }));
  box.append(head);
  if (!ram || !ram.up || !known(ram.total_mib)) {
    const why = !ram || ram.probe === "none" ? "no host RAM probe" : (ram.error || "no sample yet");
    box.append(el("p", { class: "muted", text: why }));
    return box;
  }
  const total = ram.total_mib || 1;
  const draw = filler(total);
  head.append(el("span", { text: `${gib(ram.available_mib)} available of ${gib(total)}` }));
  const bar = el("div", { class: "bar", "data-total-mib": total, "data-budget-mib": ram.budget_mib ?? "" });
  // The parts /status gives from one reading (they add up to the total): each sleeper's
  // charge within what is used, other use, available.
  for (const s of ram.sleepers) {
    const how = s.pending ? "pending" : s.charged_from;
    const inUse = s.in_use_mib ?? 0;
    const cut = inUse < s.charged_mib ? `, ${mib(inUse)} of it seen used` : "";
    bar.append(segment({ class: "seg", "data-sleeper": s.backend, style: `background:${colorOf(s.backend)}`,
      title: `${s.backend} asleep at level 1: charged ${mib(s.charged_mib)} (${how})${cut}` },
    draw(inUse), total, s.backend));
  }
  const others = ram.other_mib ?? 0;
  if (others > 0) {
    bar.append(segment({ class: "seg other", "data-segment-kind": "other",
      title: `used by others: ${mib(others)}` }, draw(others), total, "other"));
  }
  bar.append(segment({ class: "seg available", "data-segment-kind": "available",
    title: `available: ${mib(ram.available_mib)}` }, draw(ram.available_mib), total, "available", 0.15));
  if (known(ram.budget_mib)) {
    bar.append(el("div", { class: "budget-mark", style: `left:${pct(Math.min(ram.budget_mib, total), total)}`,
      title: `sleep budget ${mib(ram.budget_mib)}` }));
  }
  const budget = known(ram.budget_mib)
    ? `sleep budget ${mib(ram.budget_mib)} (${ram.budget_from}): ${mib(ram.charged_mib)} charged, ${mib(ram.free_budget_mib)} left`
    : "no sleep budget";
  box.append(bar, el("div", { class: "legend" },
    ram.sleepers.map((s) => legendItem(colorOf(s.backend), `${s.backend} ${mib(s.in_use_mib ?? 0)}`
      + `${(s.in_use_mib ?? 0) < s.charged_mib ? ` (charged ${mib(s.charged_mib)})` : ""}${s.pending ? " (pending)" : ""}`)),
    legendItem("var(--other)", `other ${mib(others)}`),
    legendItem("var(--ram-free)", `available ${mib(ram.available_mib)}`),
    el("span", { "data-field": "budget" }, el("i", { class: "mark" }), budget)));
  return box;
}

function machine(hostName, gpu, holds, ram) {
  // A host's GPUs beside its RAM (stacked on small screens).
  return el("div", { class: "machine" },
    el("div", { class: "gpus" }, ...gpuBars(hostName, gpu, holds)),
    ramBar(hostName, ram));
}
