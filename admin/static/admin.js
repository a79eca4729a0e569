// warren admin: live updates from api/stream (server-sent events), charts, and the actions.
// No framework and nothing loaded from the network. Every URL is relative to the page's
// <base href>, the handler's mount point.
"use strict";

(function () {
  const body = document.body;
  const token = document.querySelector('meta[name="csrf-token"]').content;
  const history = new Map(); // queue name -> depths, the last 60 samples
  const rateHistory = { published: [], delivered: [], acked: [] };
  const keep = 60;

  function push(list, v) {
    list.push(v);
    if (list.length > keep) list.shift();
  }

  function fmt(v) {
    if (v === undefined) return "0";
    return v >= 100 ? String(Math.round(v)) : String(Math.round(v * 10) / 10);
  }

  // bytes formats a size as page.go's byteSize does, so that the live view agrees with the page.
  function bytes(n) {
    if (n < 1024) return n + " B";
    const units = "KMGTPE";
    let v = n / 1024, i = 0;
    while (Math.round(v * 10) >= 10240 && i < units.length - 1) { v /= 1024; i++; }
    return (Math.round(v * 10) / 10).toFixed(1) + " " + units[i] + "iB";
  }

  // showMemory shows the broker's memory budget: the card, its bar, and the alarm banner.
  function showMemory(m) {
    const text = { used: bytes(m.used), limit: m.limit > 0 ? bytes(m.limit) : "no limit", waiting: m.waiting, alarms: m.alarms };
    document.querySelectorAll("[data-memory]").forEach((el) => {
      const v = text[el.dataset.memory];
      if (v !== undefined) el.textContent = v;
    });
    const bar = document.getElementById("memory-bar");
    if (bar) {
      bar.hidden = !(m.limit > 0);
      bar.value = m.limit > 0 ? Math.min(m.used / m.limit, 1) : 0;
    }
    const alarm = document.getElementById("memory-alarm");
    if (alarm) alarm.hidden = !m.alarm;
  }

  // points maps values to an SVG polyline's points across a w×h box, oldest at the left, the
  // largest value (or top) at the top, with a pixel's margin so that a line at 0 shows.
  function points(values, w, h, top) {
    if (values.length === 0) return "";
    if (values.length === 1) values = [values[0], values[0]]; // a level line, not a dot
    const n = values.length;
    const max = Math.max(top || 0, ...values, 1);
    return values.map((v, i) => {
      const x = (i * w) / (n - 1);
      return x.toFixed(1) + "," + (h - 1 - (v / max) * (h - 2)).toFixed(1);
    }).join(" ");
  }

  function polyline(svg, cls) {
    let p = svg.querySelector("polyline." + cls);
    if (!p) {
      p = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      p.setAttribute("class", cls);
      svg.appendChild(p);
    }
    return p;
  }

  function drawSpark(el, name) {
    const svg = el.querySelector("svg.spark");
    if (!svg) return;
    polyline(svg, "depth").setAttribute("points", points(history.get(name) || [], 60, 20));
  }

  // Seed each queue's chart with the depth the page was rendered with.
  document.querySelectorAll("[data-queue][data-ready]").forEach((el) => {
    const name = el.dataset.queue;
    if (!history.has(name)) history.set(name, [Number(el.dataset.ready)]);
    drawSpark(el, name);
  });

  function onSample(s) {
    for (const q of s.queues || []) {
      const depths = history.get(q.queue) || [];
      push(depths, q.ready);
      history.set(q.queue, depths);
      document.querySelectorAll('[data-queue="' + CSS.escape(q.queue) + '"]').forEach((el) => {
        for (const f of ["ready", "unacked", "consumers"]) {
          const c = el.querySelector('[data-field="' + f + '"]');
          if (c) c.textContent = q[f];
        }
        for (const f of ["in", "out"]) {
          const c = el.querySelector('[data-field="' + f + '"]');
          if (c) c.textContent = fmt(q[f]);
        }
        drawSpark(el, q.queue);
      });
    }
    if (s.memory) showMemory(s.memory);
    const t = s.totals || {};
    const totals = { queues: (s.queues || []).length, ready: t.ready, unacked: t.unacked, consumers: t.consumers, unroutable: s.unroutable };
    document.querySelectorAll("[data-total]").forEach((el) => {
      const k = el.dataset.total;
      if (totals[k] !== undefined) el.textContent = totals[k];
    });
    document.querySelectorAll("[data-rate]").forEach((el) => {
      el.textContent = fmt((s.rates || {})[el.dataset.rate]);
    });
    const chart = document.getElementById("rate-chart");
    if (chart) {
      let top = 1;
      for (const k in rateHistory) {
        push(rateHistory[k], (s.rates || {})[k] || 0);
        top = Math.max(top, ...rateHistory[k]);
      }
      for (const k in rateHistory) {
        const p = polyline(chart, "k-" + k);
        p.setAttribute("stroke", getComputedStyle(document.documentElement).getPropertyValue("--" + k).trim());
        p.setAttribute("points", points(rateHistory[k], 300, 60, top));
      }
      const scale = document.getElementById("rate-max");
      if (scale) scale.textContent = "max " + fmt(top) + "/s";
    }
  }

  if (window.EventSource && body.dataset.stream) { // pages with nothing live open no stream
    const live = document.getElementById("live");
    const es = new EventSource(body.dataset.stream);
    es.addEventListener("open", () => { live.classList.add("on"); live.textContent = "● live"; });
    es.addEventListener("error", () => { live.classList.remove("on"); live.textContent = "○ live"; });
    es.addEventListener("sample", (e) => onSample(JSON.parse(e.data)));
  }

  // Actions.

  function status(text, error) {
    const el = document.getElementById("status");
    el.textContent = text;
    el.className = error ? "error" : "";
  }

  async function post(path, payload) {
    const res = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": token },
      body: payload === undefined ? "" : JSON.stringify(payload),
      credentials: "same-origin",
    });
    let out = {};
    try { out = await res.json(); } catch (e) { /* not JSON: the status says enough */ }
    if (!res.ok) throw new Error(out.error || res.status + " " + res.statusText);
    return out;
  }

  const actions = document.getElementById("actions");
  const queueName = actions ? actions.dataset.actionsFor : "";
  // The queue's action URLs, as the page gives them (a name such as ".." cannot be a path
  // segment: those are in the query).
  const actionURL = actions ? actions.dataset : {};

  function destination() {
    const x = document.getElementById("move-exchange").value;
    if (x) return { exchange: x, routing_key: document.getElementById("move-key").value };
    const q = document.getElementById("move-to").value;
    if (!q) throw new Error("choose a queue, or an exchange and routing key");
    return { queue: q };
  }

  async function run(action) {
    switch (action) {
      case "move-selected": {
        const ids = [...document.querySelectorAll("input.select:checked")].map((c) => Number(c.value));
        if (ids.length === 0) throw new Error("select messages first");
        const out = await post(actionURL.move, { ...destination(), ids });
        return "moved " + out.moved;
      }
      case "move-first": {
        const limit = Number(document.getElementById("move-limit").value);
        const out = await post(actionURL.move, { ...destination(), limit });
        return "moved " + out.moved;
      }
      case "move-all": {
        const out = await post(actionURL.move, destination());
        return "moved " + out.moved;
      }
      case "purge": {
        if (!confirm("Purge every ready message of " + queueName + "?")) return null;
        const out = await post(actionURL.purge);
        return "purged " + out.purged;
      }
      case "delete": {
        if (!confirm("Delete queue " + queueName + " and its messages?")) return null;
        await post(actionURL.delete);
        location.href = "./";
        return null;
      }
    }
    throw new Error("unknown action " + action);
  }

  if (actions) {
    actions.addEventListener("click", async (e) => {
      const action = e.target.dataset && e.target.dataset.action;
      if (!action) return;
      try {
        const done = await run(action);
        if (done !== null) {
          sessionStorage.setItem("warren-status", done);
          location.reload();
        }
      } catch (err) {
        status(err.message, true);
      }
    });
    const all = document.getElementById("select-all");
    if (all) all.addEventListener("change", () => {
      document.querySelectorAll("input.select").forEach((c) => { c.checked = all.checked; });
    });
  }

  const publish = document.getElementById("publish");
  if (publish) {
    publish.addEventListener("submit", async (e) => {
      e.preventDefault();
      const f = new FormData(publish);
      try {
        await post("api/publish", {
          exchange: f.get("exchange"), routing_key: f.get("routing_key"), body: f.get("body"),
          content_type: f.get("content_type"), mandatory: true,
        });
        status("published to " + (f.get("exchange") || "(default)") + " with key " + f.get("routing_key"));
      } catch (err) {
        status(err.message, true);
      }
    });
  }

  const said = sessionStorage.getItem("warren-status");
  if (said) {
    sessionStorage.removeItem("warren-status");
    status(said);
  }
})();
