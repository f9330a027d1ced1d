// The raftsched dashboard (docs/ui.md): one page, no build step, no library. It reads the node's
// JSON API with the user's token, kept in this tab's sessionStorage (never in a URL or a cookie),
// and refreshes what it shows every REFRESH_MS without reloading.
"use strict";

const REFRESH_MS = 2000;
const FETCH_TIMEOUT_MS = 8000;
const TOKEN_KEY = "raftsched.token";
// A cancel's reason, at most (core/limits.py cancel_reason_chars_max; tests/test_dashboard.py compares them)
const REASON_CHARS_MAX = 256;
// Every run state the API reports (core/model.py RunState): "waiting" is a pipeline child's slot
// waiting for its parents (docs/pipelines.md) or a heartbeat job's waiting for its ping.
const STATES = ["succeeded", "failed", "dead", "running", "queued", "waiting", "skipped", "coalesced"];

const app = { me: null, cluster: null, leaderSeen: undefined, leaderChanges: 0, timer: null, page: null,
  busy: false };

// ------------------------------------------------------------------ DOM helpers (text nodes only, never HTML)
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const $ = (id) => document.getElementById(id);
const pill = (state) => h("span", { class: "pill " + state }, state);
const fmt = (v) => (v === null || v === undefined ? "—" : String(v));
function table(head, rows, empty) {
  if (!rows.length) return h("p", { class: "muted" }, empty || "none");
  return h("table", {}, h("thead", {}, h("tr", {}, head.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}
function isoOf(local) { // a datetime-local input's value (the browser's zone) as ISO-8601 UTC
  return local ? new Date(local).toISOString() : null;
}

// ------------------------------------------------------------------ the API
class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status; this.code = e.code; this.field = e.field;
  }
}
async function api(method, path, body) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = { Authorization: "Bearer " + token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  // A node that stopped answering (paused, cut off) must not stall the refresh: give up after
  // FETCH_TIMEOUT_MS and say so.
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  let r;
  try {
    r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit", cache: "no-store", signal: abort.signal });
  } catch (e) {
    throw new ApiError(0, { error: { message: abort.signal.aborted ? `no answer in ${FETCH_TIMEOUT_MS / 1000} s` : String(e.message || e) } });
  } finally {
    clearTimeout(timer);
  }
  const data = await r.json().catch(() => null);
  if (r.status === 401) { logout("The token was refused: " + ((data && data.error && data.error.message) || "401")); }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}
const get = (path) => api("GET", path);
const may = (scope) => !!(app.me && app.me.scopes.includes(scope));

// An action: hidden without the scope, confirmed first, then the page refreshed.
// A button that asks first: a yes or no, or with `why`, a reason in words (optional; run gets it,
// "" for none; Cancel in the dialog does nothing). What run returns, if text, is shown in the banner.
function action(label, scope, question, run, why = false) {
  if (!may(scope)) return null;
  return h("button", { class: "act", type: "button", "data-action": label, onclick: async (ev) => {
    let said = "";
    if (why) {
      const got = window.prompt(question + `\n\nWhy (optional, shown on the run; at most ${REASON_CHARS_MAX} characters):`, "");
      if (got === null) return;
      // (by characters, as the API counts them: a UTF-16 slice could halve an emoji, a 422)
      said = Array.from(got.trim()).slice(0, REASON_CHARS_MAX).join("");
    } else if (!window.confirm(question)) return;
    ev.target.disabled = true;
    try { const told = await run(said); flash(typeof told === "string" ? told : ""); } catch (e) { flash(`${label} failed: ${e.message}`); }
    await refresh();
  } }, label);
}

function flash(text) {
  const b = $("banner");
  b.textContent = text;
  b.hidden = !text;
}

// ------------------------------------------------------------------ the token
function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  app.me = null;
  clearInterval(app.timer);
  $("view").replaceChildren();
  $("strip").replaceChildren();
  $("who").textContent = "";
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
}

async function start() {
  $("login").hidden = true;
  try {
    app.me = await get("/v1/whoami");
  } catch (e) {
    logout(e.status === 403 ? "This token may not read (a worker token?): the dashboard needs a reader, operator or admin token."
      : "Cannot reach the API: " + e.message);
    return;
  }
  const t = app.me.tenants ? " · tenants " + app.me.tenants.join(", ") : "";
  $("who").textContent = `${app.me.role} token ${app.me.id}${t}` + (may("jobs.write") ? "" : " · read-only");
  $("logout").hidden = false;
  app.page = null;
  await refresh();
  clearInterval(app.timer);
  app.timer = setInterval(refresh, REFRESH_MS);
}

// ------------------------------------------------------------------ the cluster strip (every page)
async function strip() {
  let c;
  try {
    c = await get("/v1/cluster");
  } catch (e) {
    // 503: the node answers but cannot serve the read without a leader (or is unavailable).
    $("strip").replaceChildren(h("span", { id: "strip-leader" }, "leader ", h("b", {}, "none")),
      h("span", { class: "error" }, (e.status === 503 ? "unavailable: " : "this node does not answer: ") + e.message));
    app.cluster = null;
    if (e.status === 503) flash("This node has lost the leader: writes wait or fail until one is elected; reads may be stale.");
    return;
  }
  app.cluster = c;
  if (app.leaderSeen !== undefined && c.leader !== app.leaderSeen && c.leader) app.leaderChanges += 1;
  if (c.leader) app.leaderSeen = c.leader;
  const lag = (c.commit_index ?? 0) - (c.last_applied ?? 0);
  // A condition as a line: its type (cluster.no_leader, node.keys_missing, ...), whom it is of, for how long.
  const conds = (c.conditions || []).map((x) => [x.type || JSON.stringify(x), x.peer, x.keys && x.keys.join(","),
    typeof x.for_s === "number" ? Math.round(x.for_s) + " s" : null].filter(Boolean).join(" "));
  $("strip").replaceChildren(
    h("span", {}, "node ", h("b", {}, c.node), " (", c.role, ")"),
    h("span", { id: "strip-leader" }, "leader ", h("b", {}, c.leader ? c.leader + (c.role === "leader" ? " (this node)" : "") : "none")),
    h("span", {}, "term ", h("b", {}, fmt(c.term))),
    h("span", {}, "commit ", h("b", {}, fmt(c.commit_index)), " · applied ", h("b", {}, fmt(c.last_applied)),
      " · lag ", h("b", {}, lag)),
    h("span", {}, "jobs ", h("b", {}, fmt(c.jobs)), " · runs ", h("b", {}, fmt(c.runs))),
    h("span", { class: conds.length ? "error" : "ok" }, conds.length ? "conditions: " + conds.join(", ") : "healthy"),
  );
  if (!c.leader) flash("This node has lost the leader: writes wait or fail until one is elected; reads may be stale.");
  else if ($("banner").textContent.startsWith("This node has lost the leader")) flash("");
}

// ------------------------------------------------------------------ pages
// A page: build(view, params) makes its controls once; data(area, params) refills its data part on
// every refresh (so what the user types in a form survives the refresh).
const pages = {};

pages.cluster = {
  async data(area) {
    const c = app.cluster;
    if (!c) return;
    const followers = (c.replication && c.replication.followers) || {};
    const urls = c.member_urls || {};
    const rows = [...c.members, ...(c.learners || [])].map((m) => h("tr", {},
      h("td", {}, m), h("td", {}, m === c.leader ? "leader" : (c.learners || []).includes(m) ? "learner" : "voter"),
      h("td", {}, m === c.raft ? "this node" : ""),
      h("td", {}, urls[m] ? h("a", { href: urls[m] + "/ui/" }, urls[m]) : "—"),
      h("td", {}, followers[m] ? `${followers[m].lag_entries} entries behind, ${followers[m].state}` : m === c.leader ? "—" : "(seen from the leader)")));
    const out = [
      h("h1", {}, "Cluster"),
      h("div", { class: "grid2" },
        h("div", {}, h("h2", {}, "Members"),
          table(["Raft address", "role", "", "API", "replication"], rows)),
        h("div", {}, h("h2", {}, "This node"),
          table(["", ""], [
            ["leader", c.leader || "none"], ["term", c.term], ["commit index", c.commit_index],
            ["applied", c.last_applied], ["commit − applied", (c.commit_index ?? 0) - (c.last_applied ?? 0)],
            ["leader changes seen by this page", app.leaderChanges],
            ["clock", c.clock ? `${c.clock.state}, offset ${c.clock.offset_ms} ms` : "—"],
            ["durability", c.durability ? (c.durability.fsync ? "fsync on" : "fsync off") : "—"],
            ["conditions", (c.conditions || []).length ? JSON.stringify(c.conditions) : "none"],
          ].map(([k, v]) => h("tr", {}, h("td", { class: "muted" }, k), h("td", {}, fmt(v))))))),
    ];
    out.push(h("h2", {}, "Worker fleet"));
    try {
      const ws = await get("/v1/workers");
      out.push(table(["id", "status", "labels", "slots", "runs held", "executors", "last seen"],
        ws.workers.map((w) => h("tr", {}, h("td", {}, w.id), h("td", {}, w.status),
          h("td", {}, Object.entries(w.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"),
          h("td", {}, fmt(w.slots)), h("td", {}, fmt(w.held)), h("td", {}, (w.executors || []).join(", ")),
          h("td", {}, fmt(w.last_seen)))), "no worker registered"));
    } catch (e) {
      out.push(h("p", { class: "muted" }, "The fleet is not shown to this token: " + e.message));
    }
    out.push(h("h2", {}, "Missed deadlines"));
    try {
      const dl = await get("/v1/deadlines?state=missed&limit=20");
      out.push(table(["job", "slot", "deadline", "cause", "why"], dl.deadlines.map((d) => h("tr", {},
        h("td", {}, h("a", { href: "#/job/" + encodeURIComponent(d.job) }, d.job)), h("td", {}, fmt(d.slot)),
        h("td", {}, d.deadline), h("td", {}, d.cause), h("td", {}, d.why))), "no deadline missed"));
    } catch (e) {
      out.push(h("p", { class: "muted" }, "Deadlines are not shown to this token: " + e.message));
    }
    out.push(h("h2", {}, "Failing jobs"));
    try {
      // Each job's health (docs/notifications.md, "Health"): those whose last runs died, or with an open incident.
      const page = await get("/v1/jobs?limit=1000");
      const failing = page.jobs.filter((j) => j.health && (j.health.incident || j.health.consecutive_failures > 0));
      out.push(h("div", { id: "health" }, healthTable(failing, "no job is failing"),
        page.total > page.jobs.length ? h("p", { class: "muted" }, `of the first ${page.jobs.length} of ${page.total} jobs by name`) : null));
    } catch (e) {
      out.push(h("p", { class: "muted" }, "Job health is not shown to this token: " + e.message));
    }
    area.replaceChildren(...out);
  },
};

pages.jobs = {
  build(view) {
    const f = h("form", { class: "filters", id: "job-filters", onsubmit: (e) => { e.preventDefault(); refresh(); } },
      h("label", {}, "name contains", h("input", { name: "name", id: "f-name" })),
      h("label", {}, "label KEY=VALUE", h("input", { name: "label", id: "f-label" })),
      h("label", {}, "tenant", h("input", { name: "tenant", id: "f-tenant" })),
      h("label", {}, "state", h("select", { name: "state", id: "f-state" },
        h("option", { value: "" }, "any"), h("option", { value: "active" }, "active"),
        h("option", { value: "paused" }, "paused"), ...STATES.map((s) => h("option", { value: "last:" + s }, "last run " + s)))),
      h("button", { type: "submit" }, "Filter"));
    view.append(h("h1", {}, "Jobs"), f);
  },
  async data(area) {
    const v = (id) => ($(id) ? $(id).value.trim() : "");
    const q = new URLSearchParams({ limit: "1000" });
    if (v("f-label")) q.append("label", v("f-label"));
    let page;
    try { page = await get("/v1/jobs?" + q); } catch (e) { area.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    const name = v("f-name"), tenant = v("f-tenant"), st = v("f-state");
    const jobs = page.jobs.filter((j) => (!name || j.name.includes(name)) && (!tenant || j.spec.tenant === tenant)
      && (!st || (st === "paused" ? j.state.paused : st === "active" ? !j.state.paused
        : j.state.last_run && j.state.last_run.state === st.slice(5))));
    area.replaceChildren(h("p", { class: "muted" }, `${jobs.length} of ${page.total} jobs`),
      table(["name", "tenant", "labels", "schedule", "state", "next slot", "last outcome", ""],
        jobs.map((j) => h("tr", { "data-job": j.name },
          h("td", {}, h("a", { href: "#/job/" + encodeURIComponent(j.name) }, j.name)),
          h("td", {}, j.spec.tenant),
          h("td", {}, Object.entries(j.spec.labels || {}).map(([k, x]) => `${k}=${x}`).join(", ")),
          h("td", {}, schedText(j.spec)),
          h("td", {}, j.state.paused ? pill("paused") : "active"),
          h("td", {}, fmt(j.state.next_slot)),
          h("td", {}, j.state.last_run ? [pill(j.state.last_run.state), " ", j.state.last_run.slot,
            j.state.last_run.reason ? ` (${j.state.last_run.reason})` : ""] : "—"),
          h("td", {}, jobActions(j)))), "no job matches"));
  },
};

// Jobs' health (GET /v1/jobs: "health"), one row a job.
function healthTable(jobs, empty) {
  return table(["job", "failures in a row", "incident since", "last success", "last failure", "last outcome"],
    jobs.map((j) => {
      const x = j.health, last = x.last_slot_outcome;
      return h("tr", { "data-job": j.name }, h("td", {}, h("a", { href: "#/job/" + encodeURIComponent(j.name) }, j.name)),
        h("td", {}, fmt(x.consecutive_failures)), h("td", {}, x.incident ? x.incident.since : "—"),
        h("td", {}, fmt(x.last_success_at)), h("td", {}, fmt(x.last_failure_at)),
        h("td", {}, last ? [pill(last.outcome), " ", last.slot, last.reason ? ` (${last.reason})` : ""] : "—"));
    }), empty);
}

// A job's schedule in a few words; a pipeline child with none (its schedule null) runs after its parents.
function schedText(spec) {
  const s = spec.schedule, after = (spec.after || []).map((a) => (typeof a === "string" ? a : a.job)).join(", ");
  if (!s) return `after ${after || "its parents"}`;
  if (s.cron) return `cron ${s.cron}` + (s.timezone ? ` ${s.timezone}` : "");
  if (s.every_s) return `every ${s.every_s} s`;
  if (s.at) return `at ${s.at}`;
  return JSON.stringify(s);
}

// Why a paused job is paused: since when, by what (a token, or its pause_on_failure), the note.
function pauseWhy(p) {
  if (!p) return [];
  const who = p.reason === "pause_on_failure" ? " by pause_on_failure" : p.by ? ` by token ${p.by}` : "";
  return [h("span", { class: "pause-why", id: "pause-why" }, `since ${p.since}${who}${p.note ? ": " + p.note : ""}`), " "];
}

function jobActions(j) {
  const n = encodeURIComponent(j.name);
  return [
    j.state.paused
      ? action("resume", "jobs.write", `Resume job ${j.name}?`, () => api("POST", `/v1/jobs/${n}/resume`))
      : action("pause", "jobs.write", `Pause job ${j.name}? Its slots will be recorded as skipped.`, () => api("POST", `/v1/jobs/${n}/pause`)),
    " ",
    action("trigger", "jobs.write", `Run job ${j.name} now?`, () => api("POST", `/v1/jobs/${n}/trigger`)),
  ];
}

// Every queued run of a job (POST /v1/jobs/{name}/cancel: up to 1 000 a press; running runs go on).
// A press after one that said more goes on where it stopped (its answer's next).
const cancelAfter = {};
function cancelQueued(j) {
  const n = encodeURIComponent(j.name);
  return action("cancel queued", "jobs.write", `Cancel every queued run of ${j.name}? They do not run: their slots are ` +
    "recorded skipped (cancelled). Its running runs go on.", async (reason) => {
      const body = {};
      if (reason) body.reason = reason;
      if (cancelAfter[j.name]) body.after = cancelAfter[j.name];
      const r = await api("POST", `/v1/jobs/${n}/cancel`, body);
      if (r.more && r.next) cancelAfter[j.name] = r.next; else delete cancelAfter[j.name];
      return `${r.cancelled} queued run(s) of ${j.name} cancelled` + (r.more ? "; more may be left: press again" : "");
    }, true);
}

pages.job = {
  build(view, name) {
    const n = encodeURIComponent(name);
    const out = h("div", { id: "explain-out" });
    const explain = h("form", { class: "row", id: "explain", onsubmit: async (e) => {
      e.preventDefault();
      try {
        const res = await api("POST", `/v1/jobs/${n}/explain`,
          { down_from: isoOf($("x-from").value), down_to: isoOf($("x-to").value) });
        out.replaceChildren(explained(res));
      } catch (err) { out.replaceChildren(h("p", { class: "error" }, err.message + (err.field ? ` (${err.field})` : ""))); }
    } }, h("label", {}, "down from", h("input", { type: "datetime-local", id: "x-from", step: 1, required: true })),
    h("label", {}, "down to", h("input", { type: "datetime-local", id: "x-to", step: 1, required: true })),
    h("button", { type: "submit" }, "Explain"));
    view.append(h("h1", {}, "Job ", name), h("div", { id: "data" }),
      h("h2", {}, "What would an outage do?"), explain, out);
  },
  async data(area, name) {
    const n = encodeURIComponent(name);
    let job, runs, prev, graph;
    try {
      [job, runs, prev, graph] = await Promise.all([get(`/v1/jobs/${n}`), get(`/v1/jobs/${n}/runs?limit=120`),
        get(`/v1/jobs/${n}/preview?count=8`), get(`/v1/jobs/${n}/graph`)]);
    } catch (e) { area.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    // A slot whose deadline was missed (or met late) keeps its outcome's colour, outlined.
    const late = (r) => r.deadline && (r.deadline.state === "missed" || r.deadline.state === "late");
    const cells = [...runs.runs].reverse().map((r) => h("div", {
      class: "cell " + r.state + (late(r) ? " deadline_missed" : ""), "data-state": r.state, "data-run": r.id,
      title: `${r.slot}${r.slot_to ? " … " + r.slot_to + ` (${r.count} slots)` : ""}: ${r.state}`
        + (r.reason ? ` — ${r.reason}` : "") + (r.error ? ` — ${r.error}` : "")
        + (late(r) ? ` — deadline ${r.deadline.state}: ${r.deadline.why}` : "") }));
    area.replaceChildren(
      h("div", { class: "row" }, job.state.paused ? pill("paused") : h("span", {}, "active"),
        " ", ...pauseWhy(job.state.pause), ...jobActions(job), " ", cancelQueued(job)),
      h("h2", {}, `Recent slots (${runs.runs.length}, oldest left; hover for the reason)`),
      h("div", { class: "timeline", id: "timeline" }, cells),
      h("div", { class: "legend" }, [...STATES, "deadline_missed"].map((s) => h("span", {}, h("i", { class: "cell " + s }),
        s === "deadline_missed" ? "deadline missed or late (outlined)" : s))),
      h("div", { class: "grid2" },
        h("div", {}, h("h2", {}, "Next fires"),
          table(["slot (UTC)", "local", ""], prev.slots.map((s) => h("tr", {}, h("td", {}, s.slot), h("td", {}, s.local),
            h("td", { class: "dst" }, s.dst ? `DST ${s.dst.replace("_", " ")}` : s.ambiguous_local_time ? "ambiguous local time" : ""))),
          "no more slots")),
        h("div", {}, h("h2", {}, "State"), h("pre", {}, JSON.stringify(job.state, null, 2)))),
      h("h2", {}, "Health"), h("div", { id: "job-health" }, job.health ? healthTable([job]) : h("p", { class: "muted" }, "—")),
      h("h2", {}, "Pipeline"), h("div", { id: "graph" }, graphView(name, graph)),
      h("h2", {}, "Spec"), h("pre", { id: "spec" }, JSON.stringify(job.spec, null, 2)),
      h("h2", {}, "Runs"), runTable(runs.runs.slice(0, 20)));
  },
};

// A job's pipeline (GET /v1/jobs/{name}/graph): what it runs after and what runs after it,
// transitively, one row an edge (each job a link to its page).
function graphView(name, g) {
  const link = (j) => j === name ? h("b", {}, j) : h("a", { href: "#/job/" + encodeURIComponent(j) }, j);
  const kinds = Object.fromEntries((g.nodes || []).map((x) => [x.job, x.kind]));
  if (!(g.edges || []).length) return h("p", { class: "muted" }, "It runs after no job, and no job runs after it.");
  return h("div", {},
    h("p", {}, "runs after ", (g.parents || []).length ? g.parents.map((j, i) => [i ? ", " : "", link(j)]) : "no job",
      " · runs before ", (g.children || []).length ? g.children.map((j, i) => [i ? ", " : "", link(j)]) : "no job"),
    table(["parent", "", "child", "on"], g.edges.map((e) => h("tr", {},
      h("td", {}, link(e.from), ` (${fmt(kinds[e.from])})`), h("td", {}, "→"),
      h("td", {}, link(e.to), ` (${fmt(kinds[e.to])})`), h("td", {}, fmt(e.on))))));
}

// What explain answered: how many slots fall due, which become runs and which are recorded, and why.
function explained(x) {
  const ahead = x.fired_ahead || [];  // runs committed before the outage: they start late, whatever the policy
  const recorded = x.slots_due - x.runs.length - ahead.length;
  // A range too long to count gives a lower bound (slots_due_exact false): "at least".
  const least = x.slots_due_exact === false ? "at least " : "";
  return h("div", {},
    h("p", {}, `${least}${x.slots_due} slots due between ${x.down_from} and ${x.down_to} (${x.policy}, grace ${x.grace_s} s): `,
      h("b", {}, `${x.runs.length + ahead.length} run${x.runs.length + ahead.length === 1 ? "" : "s"}`),
      ahead.length ? ` (${ahead.length} fired ahead, starting late)` : "", ", ", h("b", {}, `${least}${recorded} recorded`),
      `; then the next slot ${fmt(x.next_slot)}.`),
    table(["run of slot", "late by", "why"], ahead.map((r) => h("tr", {}, h("td", {}, r.slot),
      h("td", {}, `${(r.start_lag_ms / 1000).toFixed(1)} s (its start)`), h("td", {}, r.why))).concat(
      x.runs.map((r) => h("tr", {}, h("td", {}, r.slot),
        h("td", {}, `${(r.fire_lag_ms / 1000).toFixed(1)} s`), h("td", {}, r.why)))), "no run"),
    table(["recorded", "reason", "from", "to", "slots", "why"], x.recorded.map((r) => h("tr", {}, h("td", {}, pill(r.state)),
      h("td", {}, r.reason), h("td", {}, r.from), h("td", {}, r.to),
      h("td", {}, r.count === null && r.count_at_least ? `more than ${r.count_at_least - 1}` : fmt(r.count)),
      h("td", {}, r.why))), "nothing recorded"));
}

function runTable(runs) {
  return table(["slot", "state", "run", "attempt", "worker", "finished", "why"], runs.map((r) => h("tr", {},
    h("td", {}, r.slot), h("td", {}, pill(r.state)),
    h("td", {}, r.kind === "recorded" ? "—" : h("a", { href: "#/run/" + encodeURIComponent(r.id) }, r.id)),
    h("td", {}, fmt(r.attempt)), h("td", {}, fmt(r.worker)), h("td", {}, fmt(r.finished_at)),
    h("td", {}, r.reason || r.error || (r.waiting_for ? JSON.stringify(r.waiting_for) : "")))), "no runs");
}

pages.runs = {
  build(view) {
    app.cursors = [null];
    const f = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); app.cursors = [null]; refresh(); } },
      h("label", {}, "state", h("select", { id: "r-state" }, h("option", { value: "" }, "any"), STATES.map((s) => h("option", { value: s }, s)))),
      h("label", {}, "slots since", h("input", { type: "datetime-local", id: "r-since", step: 1 })),
      h("label", {}, "until", h("input", { type: "datetime-local", id: "r-until", step: 1 })),
      h("button", { type: "submit" }, "Filter"));
    view.append(h("h1", {}, "Runs"), f);
  },
  async data(area) {
    const q = new URLSearchParams({ limit: "50" });
    if ($("r-state").value) q.set("state", $("r-state").value);
    if ($("r-since").value) q.set("since", isoOf($("r-since").value));
    if ($("r-until").value) q.set("until", isoOf($("r-until").value));
    const cursor = app.cursors[app.cursors.length - 1];
    if (cursor) q.set("before", cursor);
    let page;
    try { page = await get("/v1/runs?" + q); } catch (e) { area.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    area.replaceChildren(runTable(page.runs), h("div", { class: "row" },
      h("button", { type: "button", disabled: app.cursors.length < 2, onclick: () => { app.cursors.pop(); refresh(); } }, "Newer"),
      h("button", { type: "button", disabled: !page.next, onclick: () => { app.cursors.push(page.next); refresh(); } }, "Older")));
  },
};

pages.run = {
  async data(area, id) {
    let r;
    try { r = await get("/v1/runs/" + encodeURIComponent(id)); } catch (e) { area.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    const out = r.output || "";
    // A queued or running run can be cancelled (POST /v1/runs/{id}/cancel): not retried either way.
    const cancel = r.state === "queued" || r.state === "running" ? action("cancel", "jobs.write", r.state === "running"
      ? `Cancel ${r.id}? It ends failed and is not retried; its worker stops it at its next heartbeat.`
      : `Cancel ${r.id}? It does not run: its slot is recorded skipped (cancelled).`,
    async (reason) => {
      const res = await api("POST", `/v1/runs/${encodeURIComponent(r.id)}/cancel`, reason ? { reason } : undefined);
      return `${r.id} cancelled: ${res.was} -> ${res.state}`;
    }, true) : null;
    // A slot whose run ended runs again (trigger with rerun, propagating: the jobs after it
    // decide the slot again; "with downstream": those that ran for it run again too). A dead run
    // is requeued from the dead-letter queue instead; a run by hand at a time of its own
    // (NAME@T!manual-N) has no slot to run again.
    const ended = ["succeeded", "failed", "skipped", "coalesced"].includes(r.state) && !r.id.includes("!manual");
    const again = (downstream) => action(downstream ? "run again with downstream" : "run again", "jobs.write",
      `Run ${r.job}'s slot ${r.slot} again` + (downstream ? ", and the jobs after it that ran for it, after it?" : "?"),
      async () => {
        const res = await api("POST", `/v1/jobs/${encodeURIComponent(r.job)}/trigger`,
          { slot: r.slot, rerun: true, propagate: true, ...(downstream ? { downstream: true } : {}) });
        return res.created ? `${res.run} queued` : `${res.run} is still ${res.state}: the slot runs once at a time`;
      });
    const rerun = ended ? [again(false), " ", again(true)] : null;
    area.replaceChildren(h("h1", {}, "Run ", r.id), h("p", {}, pill(r.state), " job ",
      h("a", { href: "#/job/" + encodeURIComponent(r.job) }, r.job), ` · slot ${r.slot} · attempt ${fmt(r.attempt)}`,
      cancel ? [" ", cancel] : null, rerun ? [" ", ...rerun] : null),
    r.error || r.reason ? h("p", { id: "run-why" }, [r.reason, r.error].filter(Boolean).join(": ")) : null,
    h("h2", {}, "Output (its tail)"), h("pre", { id: "output" }, out.length > 4000 ? "…" + out.slice(-4000) : out || "(none)"),
    h("h2", {}, "Attempts"), h("pre", {}, JSON.stringify(r.attempts || [], null, 2)));
  },
};

pages.dlq = {
  async data(area) {
    let page;
    try { page = await get("/v1/dlq?limit=200"); } catch (e) { area.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    area.replaceChildren(h("h1", {}, "Dead letters"), h("p", { class: "muted" }, `${page.total} dead runs`),
      table(["run", "job", "queue", "attempts", "last error", "died", ""], page.runs.map((r) => h("tr", { "data-run": r.id },
        h("td", {}, h("a", { href: "#/run/" + encodeURIComponent(r.id) }, r.id)), h("td", {}, r.job), h("td", {}, r.queue),
        h("td", {}, fmt(r.attempt)), h("td", {}, fmt(r.error)), h("td", {}, fmt(r.finished_at)),
        h("td", {}, action("requeue", "dlq.write", `Queue ${r.id} again, with a fresh attempt budget?`,
          () => api("POST", `/v1/dlq/${encodeURIComponent(r.id)}/requeue`)), " ",
        action("purge", "dlq.write", `Drop ${r.id} for good?`, () => api("DELETE", `/v1/dlq/${encodeURIComponent(r.id)}`))))),
      "the dead-letter queues are empty"));
  },
};

pages.backfills = {
  async data(area) {
    let page;
    try { page = await get("/v1/backfills"); } catch (e) {
      area.replaceChildren(h("h1", {}, "Backfills"), h("p", { class: "muted" }, (e.status === 403 ? "Not shown to this token: " : "") + e.message));
      return;
    }
    const list = page.backfills || [];
    area.replaceChildren(h("h1", {}, "Backfills and bulk operations"),
      table(["id", "kind", "job", "state", "progress", "created"], list.map((b) => {
        const p = b.progress || {};
        const done = (p.succeeded || 0) + (p.failed || 0) + (p.dead || 0) + (p.left_out || 0);
        const pct = p.planned ? Math.min(100, Math.round((100 * done) / p.planned)) : (b.state === "done" ? 100 : 0);
        const bar = h("div", { class: "bar" }, h("div", {}));
        bar.firstChild.style.width = pct + "%";  // a style property, not an inline style attribute (CSP)
        return h("tr", {}, h("td", {}, b.id), h("td", {}, b.kind), h("td", {}, fmt(b.job)), h("td", {}, b.state),
          h("td", {}, bar, `${done} of ${fmt(p.planned)}`), h("td", {}, fmt(b.created_at)));
      }), "no backfill"));
  },
};

pages.queues = {
  build(view) {
    const out = h("pre", { id: "lock-out", hidden: true });
    view.append(h("h1", {}, "Queues, tenants, locks"), h("div", { id: "qt" }), h("h2", {}, "A lock"),
      h("form", { class: "row", onsubmit: async (e) => {
        e.preventDefault();
        try { out.textContent = JSON.stringify(await get("/v1/locks/" + encodeURIComponent($("lock-name").value)), null, 2); }
        catch (err) { out.textContent = err.message; }
        out.hidden = false;
      } }, h("label", {}, "name", h("input", { id: "lock-name", required: true })), h("button", { type: "submit" }, "Look up")), out);
  },
  async data(area) {
    let qs, ts;
    try { [qs, ts] = await Promise.all([get("/v1/queues"), get("/v1/tenants")]); }
    catch (e) { area.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    const queues = qs.queues || [];
    const tenants = ts.tenants || [];
    area.replaceChildren(h("h2", {}, "Queues"),
      table(["name", "depth", "ready", "running", "dead", "max depth", "on full", "oldest waiting"], queues.map((q) => h("tr", {},
        h("td", {}, q.name), h("td", {}, fmt(q.depth)), h("td", {}, fmt(q.ready)), h("td", {}, fmt(q.running)),
        h("td", {}, fmt(q.dead)), h("td", {}, fmt(q.max_depth)), h("td", {}, fmt(q.on_full)),
        h("td", {}, q.oldest_waiting_age_ms === null || q.oldest_waiting_age_ms === undefined ? "—" : `${(q.oldest_waiting_age_ms / 1000).toFixed(1)} s`))), "no queue"),
      h("h2", {}, "Tenants"),
      table(["name", "rate / s", "burst", "policy"], tenants.map((t) => h("tr", {}, h("td", {}, t.name),
        h("td", {}, fmt(t.rate_per_s)), h("td", {}, fmt(t.burst)), h("td", {}, t.policy ? JSON.stringify(t.policy) : "default"))),
      "no tenant has a rate limit or a policy"));
  },
};

pages.at = {
  build(view) {
    const out = h("div", { id: "at-out" });
    view.append(h("h1", {}, "What happened at T?"),
      h("p", { class: "muted" }, "A job and a time: the run or record of the slot that covers it, and why."),
      h("form", { class: "row", id: "at-form", onsubmit: async (e) => {
        e.preventDefault();
        const name = $("at-job").value.trim(), t = isoOf($("at-time").value);
        try {
          const res = await get(`/v1/jobs/${encodeURIComponent(name)}/runs?slot=${encodeURIComponent(t)}`);
          out.replaceChildren(res.runs.length ? runTable(res.runs)
            : h("p", {}, `No run or record of ${name} covers ${t}: no slot of its schedule falls there, or its history (the newest ${res.history_max}) no longer holds it.`));
        } catch (err) { out.replaceChildren(h("p", { class: "error" }, err.message)); }
      } }, h("label", {}, "job", h("input", { id: "at-job", required: true })),
      h("label", {}, "time", h("input", { type: "datetime-local", id: "at-time", step: 1, required: true })),
      h("button", { type: "submit" }, "Ask")), out);
  },
};

// ------------------------------------------------------------------ routing and refresh
function route() {
  const parts = (location.hash || "#/cluster").slice(2).split("/");
  const name = pages[parts[0]] ? parts[0] : "cluster";
  return { name, arg: parts.length > 1 ? decodeURIComponent(parts.slice(1).join("/")) : null };
}

async function refresh() {
  if (!app.me || app.busy) return;
  app.busy = true;
  try {
    await strip();
    const r = route();
    const key = r.name + "/" + r.arg;
    const page = pages[r.name];
    if (app.page !== key) {
      app.page = key;
      const view = $("view");
      view.replaceChildren();
      if (page.build) page.build(view, r.arg);
      if (!$("data")) view.append(h("div", { id: "data" }));
      for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.getAttribute("href") === "#/" + r.name);
    }
    if (page.data) await page.data($("data"), r.arg);
  } finally {
    app.busy = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("logout").addEventListener("click", () => logout(""));
  window.addEventListener("hashchange", refresh);
  if (sessionStorage.getItem(TOKEN_KEY)) start(); else logout("");
});
