/* modulelens UI: actions, the job table, live refresh of a page's report, and the statistics
 * plots (inline SVG).
 *
 * No framework, nothing fetched but this server's own JSON and pages. Every text from the server
 * is put into the page with textContent (never innerHTML), so it can never become markup; a
 * section refreshed when its job ends is taken, as parsed nodes, from this server's own page for
 * the same URL (rendered by its autoescaping templates; parsed scripts never run).
 */
(function () {
  "use strict";

  // ------------------------------------------------------------------------------------------
  // Small helpers
  // ------------------------------------------------------------------------------------------
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function num(x, digits) {
    if (x === null || x === undefined) return "–";
    if (typeof x !== "number") return String(x);
    if (Number.isInteger(x)) return String(x);
    return Number(x.toPrecision(digits || 3)).toString();
  }

  function seconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1e-3) return (s * 1e6).toFixed(1) + " µs";
    if (s < 1) return (s * 1e3).toFixed(2) + " ms";
    return s.toFixed(2) + " s";
  }

  async function request(method, url, body) {
    const opts = { method, headers: { "X-ModuleLens-Action": "1" }, credentials: "same-origin" };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const res = await fetch(url, opts);
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    if (!res.ok) {
      const err = new Error((data && data.error) || ("HTTP " + res.status));
      err.hint = data && data.hint;
      throw err;
    }
    return data;
  }

  // ------------------------------------------------------------------------------------------
  // Actions: forms and buttons with data-action start a job through /api/jobs
  // ------------------------------------------------------------------------------------------
  function baseParams(node) {
    try { return JSON.parse(node.getAttribute("data-params") || "{}"); } catch (e) { return {}; }
  }

  function showFormError(anchor, err) {
    let box = anchor.parentElement.querySelector(":scope > .form-error");
    if (!box) { box = el("p", { class: "form-error" }); anchor.after(box); }
    box.textContent = err ? err.message + (err.hint ? " (" + err.hint + ")" : "") : "";
    if (!err) box.remove();
  }

  async function startJob(anchor, action, params, button) {
    if (button) button.disabled = true;
    try {
      await request("POST", "/api/jobs", { action, params });
      showFormError(anchor, null);
      poll(true);
    } catch (err) {
      showFormError(anchor, err);
    } finally {
      if (button) setTimeout(() => { button.disabled = false; }, 800);
    }
  }

  document.addEventListener("submit", (ev) => {
    const form = ev.target.closest("form[data-action]");
    if (!form) return;
    ev.preventDefault();
    const params = baseParams(form);
    for (const [k, v] of new FormData(form).entries()) {
      if (v === "") continue;
      const input = form.elements[k];
      params[k] = input && input.type === "number" ? Number(v) : v;
    }
    startJob(form, form.getAttribute("data-action"), params, form.querySelector("button[type=submit]"));
  });

  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-action]");
    if (button && !button.form) {
      startJob(button, button.getAttribute("data-action"), baseParams(button), button);
      return;
    }
    const stop = ev.target.closest("button[data-stop]");
    if (stop) {
      stop.disabled = true;
      request("POST", "/api/jobs/" + encodeURIComponent(stop.getAttribute("data-stop")) + "/stop", {})
        .then(() => poll(true)).catch(() => { stop.disabled = false; });
    }
  });

  // ------------------------------------------------------------------------------------------
  // Jobs: one table, and the status line of each action on the page
  // ------------------------------------------------------------------------------------------
  const SUMMARIES = {
    replay(r) {
      const good = r.compared ? r.match : true;
      const head = r.compared
        ? (r.exact ? "exact: bit-for-bit the captured outputs" : r.match ? "match (allclose)" : "MISMATCH")
        : "ran (outputs not comparable: inputs were synthesised)";
      const parts = [head, "strategy " + r.strategy, "max abs error " + num(r.max_abs_error),
        "rebuilt in " + seconds(r.reconstruction_seconds), "ran in " + seconds(r.run_seconds)];
      return { good, text: parts.join(" · ") };
    },
    validate(r) {
      const parts = [r.verdict + ": " + r.reason];
      if (r.speedup_vs_eager !== null && r.speedup_vs_eager !== undefined) parts.push("speedup vs eager " + num(r.speedup_vs_eager) + "×");
      return { good: r.verdict !== "rejected", text: parts.join(" · "), link: "/candidates/" + encodeURIComponent(r.candidate_id) };
    },
    continue_search(r) {
      const found = (r.targets || []).filter((t) => t.best_candidate).length;
      return { good: found > 0, text: "search " + r.search_id + ": " + r.evaluations + " evaluations, best found for " + found + " of "
        + (r.targets || []).length + " target(s) · stopped: " + r.stopped_because, link: "/searches/" + encodeURIComponent(r.search_id) };
    },
    gather_stats(r) {
      const n = (r.findings || []).length;
      return { good: n === 0, text: "stored " + r.run_id + " · " + n + " finding" + (n === 1 ? "" : "s"), link: "/stats/" + encodeURIComponent(r.run_id) };
    },
  };

  function summary(job) {
    if (job.state === "done" && job.result && SUMMARIES[job.action]) return SUMMARIES[job.action](job.result);
    // any other job (an agent's start_job, the CLI): the server's reading of its result
    if (job.state === "done" && job.outcome) return { good: job.good !== false, text: job.outcome, link: job.link };
    if (job.state === "failed") return { good: false, text: (job.error || "failed") + (job.hint ? " (" + job.hint + ")" : "") };
    if (job.state === "stopped") return { good: false, text: "stopped" };
    return null;
  }

  function elapsed(job) {
    const end = job.ended_at || Date.now() / 1000;
    return seconds(Math.max(0, end - job.started_at));
  }

  function jobRow(job) {
    const s = summary(job);
    // a bar only for a real fraction; otherwise an honest "running, N s"
    const progress = job.state !== "running" ? null
      : job.progress === null ? el("span", { class: "muted", text: job.progress_text || "running" })
      : el("span", {}, el("progress", { value: job.progress, max: 1 }), " ", el("span", { class: "muted", text: job.progress_text }));
    const message = el("td", {}, s ? el("span", { text: s.text }) : el("span", { text: job.message || "" }));
    if (s && s.link) message.append(" ", el("a", { href: s.link, text: "open" }));
    if (job.state !== "running" && job.log_tail && job.log_tail.length && job.state !== "done") {
      message.append(el("details", {}, el("summary", { text: "log" }), el("pre", { text: job.log_tail.join("\n") })));
    }
    return el("tr", { "data-job": job.id },
      el("td", {}, el("span", { text: job.label })),
      el("td", {}, el("span", { class: "state state-" + job.state, text: job.state })),
      el("td", {}, progress),
      message,
      el("td", { class: "muted", text: elapsed(job) }),
      el("td", {}, job.state === "running" ? el("button", { type: "button", class: "danger", "data-stop": job.id, text: "Stop" }) : null));
  }

  function renderJobs(jobs) {
    for (const table of document.querySelectorAll("[data-jobs-table]")) {
      const body = table.tBodies[0];
      body.replaceChildren(...(jobs.length ? jobs.map(jobRow)
        : [el("tr", { class: "empty" }, el("td", { colspan: 6, text: "No jobs on this repository yet." }))]));
    }
    const panel = document.getElementById("jobs-panel");
    if (panel && jobs.length) panel.hidden = false;
    for (const box of document.querySelectorAll("[data-job-for]")) {
      const action = box.getAttribute("data-job-for");
      const subject = box.getAttribute("data-job-subject");
      const job = jobs.find((j) => j.action === action && j.subject === subject);
      if (!job) continue;
      const s = summary(job);
      const line = s
        ? el("div", { class: "result " + (s.good ? "good" : "poor"), "data-job-state": job.state }, el("span", { text: s.text }))
        : el("div", { class: "result", "data-job-state": job.state }, el("span", { class: "state state-running", text: "running" }), " ",
          el("span", { text: (job.message || job.label) + " · " + elapsed(job) }), " ",
          el("button", { type: "button", class: "danger", "data-stop": job.id, text: "Stop" }));
      if (s && s.link) line.append(" ", el("a", { href: s.link, text: "open" }));
      box.replaceChildren(line);
    }
  }

  // ------------------------------------------------------------------------------------------
  // Live refresh: a [data-refresh-for=ACTION][data-refresh-subject=S] section is replaced by its
  // new content (the same id in this URL's page, fetched again) when a job ACTION on S ends done
  // after the page was loaded ("Validate again" shows the new report without a reload).
  // ------------------------------------------------------------------------------------------
  const seenStates = new Map();
  let firstPoll = true;

  function endedSinceSeen(job) {
    return job.state === "done" && !firstPoll && seenStates.get(job.id) !== "done";
  }

  async function refreshSections(jobs) {
    const due = [...document.querySelectorAll("[data-refresh-for][id]")].filter((box) => jobs.some((j) =>
      j.action === box.getAttribute("data-refresh-for") && j.subject === box.getAttribute("data-refresh-subject")
      && endedSinceSeen(j)));
    for (const j of jobs) seenStates.set(j.id, j.state);
    firstPoll = false;
    if (!due.length) return;
    const res = await fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (!res.ok) return;
    const fresh = new DOMParser().parseFromString(await res.text(), "text/html");
    for (const box of due) {
      const next = fresh.getElementById(box.id);
      if (next) box.replaceWith(document.importNode(next, true));
    }
  }

  let timer = null;
  async function poll(soon) {
    if (timer) { clearTimeout(timer); timer = null; }
    let jobs = [];
    try {
      jobs = (await request("GET", "/api/jobs")).jobs;
      await refreshSections(jobs);
      renderJobs(jobs);
    } catch (e) { /* the server may be restarting: try again later */ }
    const running = jobs.some((j) => j.state === "running");
    timer = setTimeout(() => poll(false), soon || running ? 700 : 4000);
  }

  // ------------------------------------------------------------------------------------------
  // Plots: line charts over steps and the depth profile, drawn as SVG from the page's JSON
  // ------------------------------------------------------------------------------------------
  const PAD = { left: 56, right: 14, top: 12, bottom: 34 };

  function colour(i, n) {
    const h = 220 - 200 * (n <= 1 ? 0 : i / (n - 1));
    return "hsl(" + h.toFixed(0) + ", 65%, 45%)";
  }

  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) { const d = Math.abs(lo) || 1; lo -= d / 2; hi += d / 2; }
    const step0 = (hi - lo) / count;
    const mag = Math.pow(10, Math.floor(Math.log10(step0)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || 10 * mag;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    return { lo: Math.min(lo, ticks[0]), hi: Math.max(hi, ticks[ticks.length - 1]), ticks };
  }

  function scaleY(values, log) {
    const finite = values.filter((v) => typeof v === "number" && isFinite(v) && (!log || v > 0));
    if (!finite.length) return null;
    let lo = Math.min(...finite), hi = Math.max(...finite);
    if (log) {
      const a = Math.floor(Math.log10(lo)), b = Math.max(a + 1, Math.ceil(Math.log10(hi)));
      const ticks = [];
      const every = Math.max(1, Math.ceil((b - a) / 6));
      for (let e = a; e <= b; e += every) ticks.push(Math.pow(10, e));
      return { f: (v) => Math.log10(v), lo: a, hi: b, ticks, label: (t) => "1e" + Math.round(Math.log10(t)) };
    }
    const n = niceTicks(lo, hi, 5);
    return { f: (v) => v, lo: n.lo, hi: n.hi, ticks: n.ticks, label: (t) => num(t) };
  }

  /* chart(svgEl, {xs, xLabels, series: [{key, label, values, colour}], log, selected, onSelect, marks}) */
  function chart(root, opt) {
    root.replaceChildren();
    const box = root.getBoundingClientRect();
    const W = Math.max(320, box.width || 600), H = Math.max(200, box.height || 300);
    root.setAttribute("viewBox", "0 0 " + W + " " + H);
    const all = [].concat(...opt.series.map((s) => s.values)).filter((v) => typeof v === "number" && isFinite(v));
    // Log scale when asked for and no value is negative; zeros are then left out (and said so).
    const log = opt.log && all.some((v) => v > 0) && !all.some((v) => v < 0);
    const zeros = log ? all.filter((v) => v === 0).length : 0;
    const y = scaleY(all, log);
    if (!y || !opt.xs.length) {
      root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "no values for this statistic"));
      return;
    }
    const x0 = Math.min(...opt.xs), x1 = Math.max(...opt.xs);
    const px = (x) => PAD.left + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const py = (v) => H - PAD.bottom - ((y.f(v) - y.lo) / ((y.hi - y.lo) || 1)) * (H - PAD.top - PAD.bottom);
    const grid = svg("g", { class: "grid" }), axis = svg("g", { class: "axis" });
    for (const t of y.ticks) {
      const yy = py(t);
      grid.append(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: yy, y2: yy }));
      axis.append(svg("text", { x: PAD.left - 6, y: yy + 4, "text-anchor": "end" }, y.label(t)));
    }
    const xt = opt.xLabels ? opt.xs.filter((_, i) => i % Math.max(1, Math.ceil(opt.xs.length / 8)) === 0) : niceTicks(x0, x1, 6).ticks.filter((t) => t >= x0 && t <= x1);
    for (const t of xt) {
      axis.append(svg("text", { x: px(t), y: H - PAD.bottom + 16, "text-anchor": "middle" }, opt.xLabels ? opt.xLabels[opt.xs.indexOf(t)] : num(t)));
    }
    axis.append(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom }));
    axis.append(svg("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom }));
    axis.append(svg("text", { x: W - PAD.right, y: H - 4, "text-anchor": "end" }, opt.xTitle || "step"));
    const note = opt.log && !log ? "linear scale: negative values" : zeros ? zeros + " zero value(s) not drawn on the log scale" : "";
    if (note) axis.append(svg("text", { x: W - PAD.right, y: PAD.top + 10, "text-anchor": "end" }, note));
    root.append(grid, axis);

    const points = [];
    const lines = svg("g");
    opt.series.forEach((s) => {
      let d = "", pen = false;
      s.values.forEach((v, i) => {
        const ok = typeof v === "number" && isFinite(v) && (!log || v > 0);
        if (!ok) { pen = false; return; }
        const X = px(opt.xs[i]), Y = py(v);
        d += (pen ? "L" : "M") + X.toFixed(1) + "," + Y.toFixed(1);
        pen = true;
        points.push({ X, Y, s, i, v });
      });
      const cls = "series" + (opt.selected === null || opt.selected === undefined ? "" : s.key === opt.selected ? " selected" : " faded");
      const path = svg("path", { d: d || "M0,0", class: cls, stroke: s.colour, "data-series": s.key });
      path.addEventListener("click", () => opt.onSelect && opt.onSelect(s.key));
      lines.append(path);
      if (opt.dots) s.values.forEach((v, i) => {
        if (typeof v !== "number" || !isFinite(v) || (log && v <= 0)) return;
        const c = svg("circle", { cx: px(opt.xs[i]), cy: py(v), r: 2.5, fill: s.colour, class: "point" });
        c.addEventListener("click", () => opt.onSelect && opt.onSelect(opt.pointKey ? opt.pointKey(i) : s.key));
        lines.append(c);
      });
    });
    root.append(lines);
    for (const m of opt.marks || []) {
      if (!m.show) continue;
      const v = m.value, drawable = typeof v === "number" && isFinite(v) && (!log || v > 0);
      const mark = svg("circle", { cx: px(m.x), cy: drawable ? py(v) : H - PAD.bottom, r: 5.5, class: m.cls || "finding-mark" });
      mark.append(svg("title", {}, m.title || ""));
      root.append(mark);
    }
    const list = root.parentElement && root.parentElement.querySelector(":scope > .legend-list");
    if (list) list.remove();
    if (opt.legend && opt.series.length <= 8) {
      const legend = svg("g", { class: "legend" });
      opt.series.forEach((s, i) => {
        const yy = PAD.top + 6 + i * 15;
        legend.append(svg("line", { x1: PAD.left + 10, x2: PAD.left + 26, y1: yy, y2: yy, stroke: s.colour, "stroke-width": 2.5 }));
        legend.append(svg("text", { x: PAD.left + 30, y: yy + 4 }, s.label));
      });
      root.append(legend);
    } else if (opt.legend) {
      // Too many to draw over the plot: a list under it that scrolls; an entry selects its line.
      const items = opt.series.map((s) => {
        const swatch = document.createElementNS(SVG, "svg");
        swatch.setAttribute("viewBox", "0 0 18 8");
        swatch.append(svg("line", { x1: 0, x2: 18, y1: 4, y2: 4, stroke: s.colour, "stroke-width": 3 }));
        const item = el("li", { "data-legend": s.key, class: s.key === opt.selected ? "selected" : null }, swatch, el("span", { text: s.label }));
        item.addEventListener("click", () => opt.onSelect && opt.onSelect(s.key));
        return item;
      });
      root.after(el("ul", { class: "legend-list", "aria-label": "legend" }, ...items));
    }

    const tip = svg("g", { class: "tip", visibility: "hidden" });
    const tipBg = svg("rect", { rx: 4, ry: 4 }), tipText = svg("text", {});
    tip.append(tipBg, tipText);
    root.append(tip);
    root.onmousemove = (ev) => {
      const r = root.getBoundingClientRect();
      const mx = (ev.clientX - r.left) * (W / r.width), my = (ev.clientY - r.top) * (H / r.height);
      let best = null, bd = 400;
      for (const p of points) {
        const d = (p.X - mx) ** 2 + (p.Y - my) ** 2;
        if (d < bd) { bd = d; best = p; }
      }
      if (!best) { tip.setAttribute("visibility", "hidden"); return; }
      tipText.textContent = opt.tipText(best.s, best.i, best.v);
      const tw = tipText.getComputedTextLength() + 12;
      const tx = Math.min(best.X + 10, W - tw - 2), ty = Math.max(best.Y - 26, 2);
      tipBg.setAttribute("x", tx); tipBg.setAttribute("y", ty); tipBg.setAttribute("width", tw); tipBg.setAttribute("height", 20);
      tipText.setAttribute("x", tx + 6); tipText.setAttribute("y", ty + 14);
      tip.setAttribute("visibility", "visible");
    };
    root.onmouseleave = () => tip.setAttribute("visibility", "hidden");
  }

  function statsPage() {
    const dataNode = document.getElementById("stats-data");
    if (!dataNode) return;
    const data = JSON.parse(dataNode.textContent);
    const statSel = document.querySelector("[data-plot-stat]");
    const logBox = document.querySelector("[data-plot-log]");
    const stepInput = document.querySelector("[data-plot-step]");
    const stepLabel = document.querySelector("[data-plot-step-label]");
    const selectedLabel = document.querySelector("[data-plot-selected]");
    const modules = data.modules;
    const n = modules.length;
    const findingModules = new Set(data.findings.map((f) => f.module));
    let selected = null;
    let selectedType = null;

    const column = (obj, kindStat) => {
      const [kind, stat] = kindStat.split(".");
      return ((obj[kind] || {})[stat]) || [];
    };
    const labelOf = (name) => name === "" ? "(root)" : name;

    function select(name) {
      selected = selected === name ? null : name;
      for (const row of document.querySelectorAll("[data-module-row]")) {
        row.classList.toggle("selected", row.getAttribute("data-module-row") === selected);
      }
      selectedLabel.textContent = selected === null ? "" : "selected: " + labelOf(selected);
      draw();
    }

    function draw() {
      const stat = statSel.value, log = logBox.checked;
      const si = Number(stepInput.value);
      stepLabel.textContent = data.steps.length ? String(data.steps[si]) : "";
      chart(document.querySelector('[data-plot="steps"]'), {
        xs: data.steps, log, selected, onSelect: select, dots: data.steps.length < 40,
        series: modules.map((m, i) => ({ key: m.name, label: labelOf(m.name), values: column(m, stat), colour: colour(i, n) })),
        tipText: (s, i, v) => s.label + " · step " + data.steps[i] + ": " + num(v),
      });
      const depthValues = modules.map((m) => column(m, stat)[si] ?? null);
      chart(document.querySelector('[data-plot="depth"]'), {
        xs: modules.map((_, i) => i), xLabels: modules.map((m) => m.name.split(".").slice(-2).join(".") || "root"), xTitle: "module (execution order)",
        log, selected: null, dots: true, pointKey: (i) => modules[i].name, onSelect: select,
        series: [{ key: "__depth", label: stat, values: depthValues, colour: "#2f6fde" }],
        marks: modules.map((m, i) => ({ x: i, value: depthValues[i], show: findingModules.has(m.name) || m.name === selected,
          cls: findingModules.has(m.name) ? "finding-mark" : "selected-mark",
          title: labelOf(m.name) + (findingModules.has(m.name) ? ": has a finding" : "") })),
        tipText: (s, i, v) => labelOf(modules[i].name) + " (" + modules[i].type + "): " + num(v),
      });
      const types = data.types;
      chart(document.querySelector('[data-plot="types"]'), {
        xs: data.steps, log, selected: selectedType, dots: data.steps.length < 40, legend: true,
        onSelect: (key) => { selectedType = selectedType === key ? null : key; draw(); },
        series: types.map((t, i) => ({ key: t.type, label: t.type + " (" + t.modules.length + ")", values: column(t, stat), colour: colour(i, types.length) })),
        tipText: (s, i, v) => s.label + " · step " + data.steps[i] + ": " + num(v),
      });
    }

    statSel.addEventListener("change", draw);
    logBox.addEventListener("change", draw);
    stepInput.addEventListener("input", draw);
    for (const a of document.querySelectorAll(".module-link")) {
      a.addEventListener("click", () => { selected = null; select(a.getAttribute("data-module")); });
    }
    window.addEventListener("resize", draw);
    draw();
  }

  document.addEventListener("DOMContentLoaded", () => {
    statsPage();
    poll(false);
  });
})();
