// ollie's web page: the sessions, one session, batch jobs, memory, tools and agents.
// Everything a model, a tool or a user wrote is put into the page as text (textContent, text
// nodes): never as markup. No innerHTML anywhere. The server's Content-Security-Policy allows
// this script and nothing inline.
"use strict";

const MARKERS = ["user: ", "assistant: ", "reasoning: ", "-> ", "retrying in ", "error: ", ":: "];
const main = document.getElementById("main");
let cleanup = () => {};

function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  };
  const r = await fetch(path, init);
  let j;
  try { j = await r.json(); } catch { j = { error: r.status + " " + r.statusText }; }
  if (!r.ok) throw new Error(j.error || r.statusText);
  return j;
}

function say(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "err" : "muted";
}

const enc = encodeURIComponent;
const busy = (state) => state !== "idle" && state !== "done" && !String(state).startsWith("failed") && state !== "cancelled";
const money = (c) => "$" + Number(c || 0).toFixed(4);
function ago(t) {
  if (!t) return "";
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return new Date(t * 1000).toISOString().slice(0, 16).replace("T", " ");
}

// One live stream from the server: a WebSocket (browsers allow a handful of long HTTP requests per
// server, and each open page holds one stream), reopened after a drop, resuming a chat where it
// was (the id of its last message is the chat's byte offset).
function live(path, handlers) {
  let ws = null;
  let closed = false;
  let wait = 250;
  let last = null;
  const open = () => {
    const sep = path.includes("?") ? "&" : "?";
    ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path +
      (last !== null ? sep + "from=" + enc(last) : ""));
    ws.onmessage = (m) => {
      const d = JSON.parse(m.data);
      if (d.id !== null && d.id !== undefined) last = d.id;
      wait = 250;
      const h = handlers[d.event];
      if (h) h(d.data);
    };
    ws.onclose = () => {
      if (closed) return;
      say("reconnecting…", true);
      setTimeout(() => { if (!closed) open(); }, wait);
      wait = Math.min(wait * 2, 10000);
    };
  };
  open();
  return { close() { closed = true; if (ws) ws.close(); } };
}

// ---- the sessions' table -----------------------------------------------------------------------
function sessionsView() {
  const rows = new Map();
  const body = el("tbody");
  const filter = el("input", { type: "search", placeholder: "filter: id, agent, model, cwd, prompt", size: 36, id: "filter" });
  const stateSel = el("select", { id: "statefilter" },
    el("option", { value: "" }, "every state"), el("option", { value: "busy" }, "busy"), el("option", { value: "idle" }, "idle"));
  const agentSel = el("select", { id: "new-agent" });
  const backendSel = el("select", { id: "new-backend" }, el("option", { value: "" }, "the agent's backend"));
  const cwd = el("input", { id: "new-cwd", placeholder: "cwd (absolute)", size: 28 });
  const model = el("input", { id: "new-model", placeholder: "model (default)", size: 16 });
  const count = el("span", { class: "muted" });
  api("/api/meta").then((m) => {
    for (const a of m.agents) agentSel.append(el("option", { value: a }, a));
    agentSel.value = m.agents.includes("default") ? "default" : (m.agents[0] || "");
    for (const b of m.backends) {  // "name *" is the default
      const name = b.replace(/ \*$/, "");
      backendSel.append(el("option", { value: name }, name + (name === b ? "" : " (default)")));
    }
    cwd.value = m.cwd;
  }).catch((e) => say(e.message, true));
  const create = async () => {
    try {
      const r = await api("/api/s/new", { agent: agentSel.value, backend: backendSel.value, cwd: cwd.value, model: model.value });
      location.hash = "#/s/" + enc(r.id);
    } catch (e) { say(e.message, true); }
  };
  const matches = (tr) => {
    const q = filter.value.trim().toLowerCase();
    const st = stateSel.value;
    if (st === "busy" && !busy(tr.dataset.state)) return false;
    if (st === "idle" && tr.dataset.state !== "idle") return false;
    return !q || tr.dataset.text.includes(q);
  };
  const refilter = () => {
    let shown = 0;
    for (const tr of rows.values()) { tr.hidden = !matches(tr); if (!tr.hidden) shown++; }
    count.textContent = shown + " of " + rows.size + " sessions";
  };
  filter.addEventListener("input", refilter);
  stateSel.addEventListener("change", refilter);
  const cells = ["id", "agent", "model", "state", "cwd", "ctx", "cost", "prompt", "updated"];
  const fill = (tr, r) => {
    const c = tr.children;
    c[0].firstChild.textContent = r.id;
    c[0].firstChild.setAttribute("href", "#/s/" + enc(r.id));
    c[1].textContent = r.agent;
    c[2].textContent = r.model;
    c[3].textContent = r.state;
    c[3].className = "state" + (busy(r.state) ? " busy" : "");
    c[4].textContent = r.cwd;
    c[4].title = r.cwd;
    c[5].textContent = r.ctx + "%";
    c[6].textContent = money(r.cost);
    c[7].textContent = r.prompt;
    c[7].title = r.prompt;
    c[8].textContent = ago(r.updated);
    tr.dataset.updated = r.updated;
    tr.dataset.state = r.state;
    tr.dataset.text = [r.id, r.agent, r.model, r.cwd, r.prompt, r.parent].join(" ").toLowerCase();
    tr.hidden = !matches(tr);
  };
  const make = (r) => {
    const end = el("button", { class: "danger", title: "end this session (kill)" }, "end");
    end.addEventListener("click", async () => {
      if (!confirm("End session " + r.id + "?")) return;
      try { await api("/api/s/" + enc(tr.dataset.id) + "/ctl", { line: "kill" }); } catch (e) { say(e.message, true); }
    });
    const tr = el("tr", {}, el("td", {}, el("a")), el("td"), el("td"), el("td"), el("td", { class: "cwd" }),
      el("td", { class: "num" }), el("td", { class: "num" }), el("td", { class: "prompt" }), el("td", { class: "muted" }), el("td", {}, end));
    tr.dataset.id = r.id;
    return tr;
  };
  const src = live("/ws/sessions", { rows: (d) => {
    if (d.reset) { rows.clear(); body.replaceChildren(); }
    const frag = document.createDocumentFragment();
    for (const r of d.rows) {
      let tr = rows.get(r.id);
      if (!tr) { tr = make(r); rows.set(r.id, tr); frag.append(tr); }
      fill(tr, r);
    }
    body.append(frag);
    for (const id of d.gone || []) { const tr = rows.get(id); if (tr) { tr.remove(); rows.delete(id); } }
    refilter();
    say("live");
  } });
  main.replaceChildren(
    el("div", { class: "bar" }, filter, stateSel, count),
    el("div", { class: "bar" }, el("strong", {}, "new session:"), agentSel, backendSel, cwd, model,
      el("button", { id: "new-session", onclick: create }, "start")),
    el("table", { id: "sessions" }, el("thead", {}, el("tr", {}, ...cells.map((c) => el("th", {}, c === "ctx" ? "context" : c)), el("th"))), body),
  );
  const tick = setInterval(() => {
    for (const tr of rows.values()) if (!tr.hidden) tr.children[8].textContent = ago(Number(tr.dataset.updated));
  }, 30000);
  return () => { src.close(); clearInterval(tick); };
}

// ---- the chat, parsed as it grows ---------------------------------------------------------------
function markerOf(line) {
  for (const m of MARKERS) if (line.startsWith(m)) return m;
  return null;
}
function unquote(line) {
  // A content line that would start with a marker is quoted with one ">" per level: drop one.
  const m = /^(>+)(.*)$/s.exec(line);
  if (m && markerOf(m[2])) return line.slice(1);
  return line;
}
const KIND = { "user: ": "user", "assistant: ": "assistant", "reasoning: ": "reasoning", "-> ": "call",
  "retrying in ": "retry", "error: ": "error", ":: ": "info" };

function parseBlocks(text, from) {
  const blocks = [];
  let pos = from;
  let cur = null;
  while (pos < text.length) {
    let nl = text.indexOf("\n", pos);
    const end = nl < 0 ? text.length : nl + 1;
    const line = text.slice(pos, nl < 0 ? text.length : nl);
    const m = markerOf(line);
    if (m) {
      cur = { kind: KIND[m], start: pos, head: (m === "retrying in " ? line : line.slice(m.length)), lines: [] };
      if (m === "retrying in ") cur.head = line;
      blocks.push(cur);
    } else {
      if (!cur) { cur = { kind: "text", start: pos, head: null, lines: [] }; blocks.push(cur); }
      cur.lines.push(unquote(line));
    }
    pos = end;
  }
  return blocks;
}

function trimEnd(lines) {
  const out = lines.slice();
  while (out.length && out[out.length - 1] === "") out.pop();
  return out;
}

function looksLikeDiff(lines) {
  return lines.some((l) => l.startsWith("@@") || l.startsWith("diff --git") || l.startsWith("+++ "));
}
function outputNode(lines) {
  const pre = el("pre", { class: "out" });
  if (!looksLikeDiff(lines)) { pre.textContent = lines.join("\n"); return pre; }
  for (const l of lines) {
    let cls = "";
    if (l.startsWith("+++") || l.startsWith("---") || l.startsWith("diff ") || l.startsWith("index ")) cls = "meta";
    else if (l.startsWith("+")) cls = "add";
    else if (l.startsWith("-")) cls = "del";
    else if (l.startsWith("@@")) cls = "hunk";
    pre.append(el("span", { class: cls }, l === "" ? " " : l));
  }
  return pre;
}

// Markdown, rendered into elements whose text is set as text: headings, paragraphs, lists,
// quotes, code fences, `code`, **bold**, *emphasis*, and links to http(s) addresses only.
function inline(text) {
  const frag = document.createDocumentFragment();
  const re = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*)|(\[[^\]\n]+\]\((https?:\/\/[^\s)]+)\))/g;
  let last = 0;
  let m;
  while ((m = re.exec(text))) {
    if (m.index > last) frag.append(document.createTextNode(text.slice(last, m.index)));
    if (m[1]) frag.append(el("code", {}, m[1].slice(1, -1)));
    else if (m[2]) frag.append(el("strong", {}, m[2].slice(2, -2)));
    else if (m[3]) frag.append(el("em", {}, m[3].slice(1, -1)));
    else if (m[4]) {
      const a = el("a", { rel: "noopener noreferrer", target: "_blank" }, m[4].slice(1, m[4].indexOf("](")));
      a.href = m[5];
      frag.append(a);
    }
    last = re.lastIndex;
  }
  if (last < text.length) frag.append(document.createTextNode(text.slice(last)));
  return frag;
}
function markdown(lines) {
  const root = el("div", { class: "md" });
  let i = 0;
  let para = [];
  const flush = () => { if (para.length) { root.append(el("p", {}, inline(para.join("\n")))); para = []; } };
  while (i < lines.length) {
    const l = lines[i];
    if (l.startsWith("```")) {
      flush();
      const code = [];
      i++;
      while (i < lines.length && !lines[i].startsWith("```")) code.push(lines[i++]);
      i++;
      root.append(el("pre", {}, el("code", {}, code.join("\n"))));
      continue;
    }
    const h = /^(#{1,6})\s+(.*)$/.exec(l);
    if (h) { flush(); root.append(el("h" + Math.min(4, h[1].length + 1), {}, inline(h[2]))); i++; continue; }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(l)) {
      flush();
      const ordered = /^\s*\d/.test(l);
      const list = el(ordered ? "ol" : "ul");
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        list.append(el("li", {}, inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""))));
        i++;
      }
      root.append(list);
      continue;
    }
    if (l.startsWith("> ")) {
      flush();
      const q = [];
      while (i < lines.length && lines[i].startsWith("> ")) q.push(lines[i++].slice(2));
      root.append(el("blockquote", {}, inline(q.join("\n"))));
      continue;
    }
    if (l.trim() === "") { flush(); i++; continue; }
    para.push(l);
    i++;
  }
  flush();
  return root;
}

class Chat {
  constructor(root) {
    this.root = root;
    this.text = "";
    this.from = 0; // where the last (still growing) block starts
    this.tail = [];
    this.opened = new Map(); // a folded block's start -> open or not, kept across re-renders
  }
  append(t) {
    this.text += t;
    for (const n of this.tail) n.remove();
    this.tail = [];
    const blocks = parseBlocks(this.text, this.from);
    const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    blocks.forEach((b, i) => {
      const node = this.render(b);
      this.root.append(node);
      if (i === blocks.length - 1) { this.tail = [node]; this.from = b.start; }
    });
    if (atBottom) window.scrollTo(0, document.body.scrollHeight);
  }
  fold(b, cls, summary, ...kids) {
    const d = el("details", { class: "blk " + cls }, el("summary", {}, summary), ...kids);
    if (this.opened.get(b.start)) d.open = true;
    d.addEventListener("toggle", () => this.opened.set(b.start, d.open));
    return d;
  }
  render(b) {
    const lines = trimEnd(b.lines);
    switch (b.kind) {
      case "user": return el("div", { class: "blk user" }, [b.head, ...lines].join("\n"));
      case "assistant": { const d = el("div", { class: "blk assistant" }); d.append(markdown([b.head, ...lines])); return d; }
      case "reasoning": return this.fold(b, "reasoning", "reasoning (" + (lines.length + 1) + " lines)", el("div", {}, [b.head, ...lines].join("\n")));
      case "call": {
        const m = /^([^(]*)\((.*)\)$/s.exec(b.head);
        const name = m ? m[1] : b.head;
        const args = m ? m[2] : "";
        const short = args.length > 90 ? args.slice(0, 90) + "…" : args;
        return this.fold(b, "call", "→ " + name + "(" + short + ")" + (lines.length ? "  · " + lines.length + " lines" : ""),
          el("pre", { class: "args" }, args), outputNode(lines));
      }
      case "error": return el("div", { class: "blk error" }, "error: " + [b.head, ...lines].join("\n"));
      case "retry": return el("div", { class: "blk retry" }, [b.head, ...lines].join("\n"));
      case "info": return el("div", { class: "blk info" }, ":: " + [b.head, ...lines].join("\n"));
      default: return el("div", { class: "blk text" }, lines.join("\n"));
    }
  }
}

// ---- one session (or one job: kind "b") ------------------------------------------------------------
function treeList(items) {
  const ul = el("ul", { class: "tree" });
  for (const it of items) {
    const href = (it.kind === "job" ? "#/b/" : "#/s/") + enc(it.id);
    ul.append(el("li", {}, el("a", { href }, it.id), " ", el("span", { class: "muted" }, it.kind + ", " + it.state),
      it.children.length ? treeList(it.children) : null));
  }
  return ul;
}

function pageView(kind, id) {
  const chatRoot = el("div", { class: "chat", id: "chat" });
  const chat = new Chat(chatRoot);
  const state = el("span", { class: "state", id: "state" });
  const facts = el("dl", { id: "facts" });
  const plan = el("pre", { id: "plan" });
  const tree = el("div", { id: "tree" });
  const extra = el("pre", { class: "hidden", id: "extra" });
  const side = el("aside", {},
    el("section", {}, el("h3", {}, kind === "b" ? "job" : "session"), facts),
    el("section", {}, el("h3", {}, "plan"), plan),
    el("section", {}, el("h3", {}, kind === "b" ? "its sub-agents" : "sub-sessions and jobs"), tree));
  const top = el("div", { class: "bar" }, el("strong", {}, id), state);
  const parts = [top, el("div", { class: "layout" }, el("div", {}, chatRoot, extra, kind === "s" ? promptBox(id) : null), side)];
  if (kind === "s") {
    const ctl = (line) => api("/api/s/" + enc(id) + "/ctl", { line }).then(() => say(line + ": done"), (e) => say(e.message, true));
    const show = (name) => api("/api/s/" + enc(id) + "/file/" + name).then((r) => {
      extra.textContent = r.text; extra.classList.remove("hidden");
    }, (e) => say(e.message, true));
    top.append(
      el("button", { id: "stop", onclick: () => ctl("stop") }, "stop"),
      el("button", { onclick: () => show("mcp") }, "tools"),
      el("button", { onclick: () => show("cfg") }, "settings"),
      el("button", { onclick: () => api("/api/s/" + enc(id) + "/commands").then((r) => {
        extra.textContent = r.text; extra.classList.remove("hidden");
      }, (e) => say(e.message, true)) }, "commands"),
      el("button", { class: "danger", onclick: () => confirm("End session " + id + "?") && ctl("kill") }, "end"),
    );
  } else {
    top.append(el("button", { class: "danger", onclick: () => confirm("Remove job " + id + "?") &&
      api("/api/b/" + enc(id) + "/rm", {}).then(() => { location.hash = "#/b"; }, (e) => say(e.message, true)) }, "remove"));
  }
  main.replaceChildren(...parts);
  const src = live("/ws/page/" + enc(id), { chat: (d) => chat.append(d.text), gone: () => {
    say(id + " has ended"); state.textContent = "ended"; src.close();
  }, info: (d) => {
    const st = d.kind === "job" ? d.status : d.state;
    state.textContent = st;
    state.className = "state" + (busy(st) ? " busy" : "");
    const pairs = d.kind === "job"
      ? [["status", d.status], ["agent", d.agent], ["model", d.model], ["time", d.seconds == null ? "" : d.seconds + " s"],
         ["usage", d.usage], ["cost", money(d.cost)], ["from", d.parent || "you"], ["result", d.result]]
      : [["agent", d.agent], ["backend", d.backend], ["model", d.model], ["cwd", d.cwd], ["context", d.ctx + "% (" + d.ctxText + ")"],
         ["usage", d.usage], ["cost", money(d.cost) + (d.priceKnown ? "" : " (no price known)")]];
    facts.replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    if (d.parent && d.kind !== "job") facts.append(el("dt", {}, "parent"), el("dd", {}, el("a", { href: "#/s/" + enc(d.parent) }, d.parent)));
    plan.textContent = d.kind === "job" ? d.spec : (d.plan || "(none)");
    tree.replaceChildren(d.tree.length ? treeList(d.tree) : el("span", { class: "muted" }, "none"));
    say("live");
  } });
  return () => src.close();
}

function promptBox(id) {
  const ta = el("textarea", { id: "prompt", placeholder: "a prompt, or a /command: Enter sends, Shift-Enter a new line; during a turn it queues" });
  const send = async () => {
    const text = ta.value;
    if (!text.trim()) return;
    try {
      await api("/api/s/" + enc(id) + "/prompt", { text });
      ta.value = "";
      hints.replaceChildren();
      say("sent");
    } catch (e) { say(e.message, true); }
  };
  ta.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
  });
  // A line starting with "/" is a slash command (the session's commands, as `cat ctl` lists them):
  // the matching ones are offered under the box.
  const hints = el("div", { class: "bar hints", id: "hints" });
  let names = null;
  let loading = false;
  const offer = () => {
    const m = /^\/(\S*)$/.exec(ta.value);
    if (!m || !names) { hints.replaceChildren(); return; }
    hints.replaceChildren(...names.filter((n) => n.startsWith(m[1])).map((n) =>
      el("button", { class: "hint", onclick: () => { ta.value = "/" + n + " "; hints.replaceChildren(); ta.focus(); } }, "/" + n)));
  };
  ta.addEventListener("input", async () => {
    if (ta.value.startsWith("/") && names === null && !loading) {
      loading = true;
      try {
        names = (await api("/api/s/" + enc(id) + "/commands")).text.split(/[,\s]+/).filter(Boolean);
      } catch (e) { names = []; say(e.message, true); }
    }
    offer();  // what the box holds now, whatever was typed while the names came
  });
  return el("div", {}, el("div", { class: "promptbox" }, ta, el("button", { id: "send", onclick: send }, "send")), hints);
}

// ---- batch jobs ---------------------------------------------------------------------------------
function jobsView() {
  const rows = new Map();
  const body = el("tbody");
  const spec = el("textarea", { class: "spec", id: "spec" });
  api("/api/meta").then((m) => { if (!spec.value) spec.value = m.jobTemplate; }).catch((e) => say(e.message, true));
  const answer = el("span", { class: "muted", id: "submitted" });
  const cards = el("div", { class: "cols", id: "cards" });
  const runs = el("datalist", { id: "runs" });
  const submit = async () => {
    try {
      const r = await api("/api/b/new", { spec: spec.value });
      answer.textContent = "made " + r.ids.join(", ");
    } catch (e) { answer.textContent = e.message; answer.className = "err"; }
  };
  const fill = (tr, r) => {
    const c = tr.children;
    c[0].firstChild.textContent = r.id;
    c[0].firstChild.setAttribute("href", "#/b/" + enc(r.id));
    c[1].textContent = r.status;
    c[1].className = "state" + (busy(r.status) ? " busy" : "");
    c[2].textContent = r.agent;
    c[3].textContent = money(r.cost);
    c[4].textContent = r.seconds == null ? "" : r.seconds + " s";
    c[5].textContent = r.prompt;
    tr.dataset.name = r.name;
  };
  const src = live("/ws/jobs", { rows: (d) => {
    if (d.reset) { rows.clear(); body.replaceChildren(); }
    for (const r of d.rows) {
      let tr = rows.get(r.id);
      if (!tr) {
        tr = el("tr", {}, el("td", {}, el("a")), el("td"), el("td"), el("td", { class: "num" }), el("td", { class: "num" }), el("td", { class: "prompt" }));
        rows.set(r.id, tr);
        body.append(tr);
      }
      fill(tr, r);
    }
    for (const id of d.gone || []) { const tr = rows.get(id); if (tr) { tr.remove(); rows.delete(id); } }
    runs.replaceChildren(...runsOf([...rows.keys()]).map((r) => el("option", { value: r })));
    say("live");
  } });
  main.replaceChildren(
    el("table", { id: "jobs" }, el("thead", {}, el("tr", {}, ...["id", "status", "agent", "cost", "time", "prompt"].map((c) => el("th", {}, c)))), body),
    el("h3", {}, "submit a spec (as b/new takes it)"), spec,
    el("div", { class: "bar" }, el("button", { id: "submit-job", onclick: submit }, "submit"), answer),
    el("h3", {}, "compare: the jobs of one spec side by side"),
    el("div", { class: "bar" }, runs, el("input", { id: "compare-name", placeholder: "a spec's name (u/optimize's run)", list: "runs", size: 36 }),
      el("button", { id: "compare", onclick: () => compare(document.getElementById("compare-name").value, rows, cards) }, "compare")),
    cards,
  );
  return () => src.close();
}

// u/optimize names its candidates <name>-0, <name>-1, … and its judge <name>-judge-0, whose answer's
// first line is the number of the candidate it picks.
function runsOf(ids) {
  const runs = new Set();
  for (const id of ids) {
    const m = /^(.*)-(\d+)$/.exec(id);
    if (m && !m[1].endsWith("-judge")) runs.add(m[1]);
  }
  return [...runs].filter((r) => ids.includes(r + "-judge-0") || [...ids].filter((i) => i.startsWith(r + "-")).length > 1);
}

async function compare(name, rows, cards) {
  cards.replaceChildren();
  const ids = [...rows.keys()];
  const candidates = ids.filter((id) => new RegExp("^" + name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "-\\d+$").test(id))
    .sort((a, b) => Number(a.slice(name.length + 1)) - Number(b.slice(name.length + 1)));
  const judgeId = name + "-judge-0";
  const get = (id) => api("/api/b/" + enc(id)).catch((e) => ({ id, status: "?", result: e.message, cost: 0 }));
  const [results, judge] = await Promise.all([Promise.all(candidates.map(get)), ids.includes(judgeId) ? get(judgeId) : null]);
  const pick = judge ? Number(((judge.result || "").split("\n")[0].match(/\d+/) || ["0"])[0]) : 0;
  results.forEach((d, i) => {
    const card = el("div", { class: "card" + (pick === i + 1 ? " pick" : ""), "data-id": d.id },
      el("h4", {}, el("a", { href: "#/b/" + enc(d.id) }, "candidate " + (i + 1) + ": " + d.id), pick === i + 1 ? " (the judge's pick)" : ""),
      el("div", { class: "muted" }, d.status + ", " + money(d.cost)), markdown((d.result || "").split("\n")));
    cards.append(card);
  });
  if (judge) {
    cards.append(el("div", { class: "card judge" }, el("h4", {}, el("a", { href: "#/b/" + enc(judgeId) }, "the judge: " + judgeId)),
      el("div", { class: "muted" }, judge.status + ", " + money(judge.cost)), markdown((judge.result || "").split("\n"))));
  }
  if (!results.length) cards.append(el("p", { class: "muted" }, "no job named " + name + "-<n>"));
}

// ---- memory --------------------------------------------------------------------------------------
function memoryView() {
  const q = el("input", { type: "search", id: "memq", placeholder: "search the memories (empty: the newest)", size: 40 });
  const list = el("div", { id: "memories" });
  const search = async () => {
    try {
      const r = await api("/api/m?q=" + enc(q.value));
      list.replaceChildren(...(r.results.length ? r.results.map(card) : [el("p", { class: "muted" }, "no memory found")]));
    } catch (e) { say(e.message, true); }
  };
  const card = (m) => {
    const text = el("pre", {}, m.text);
    return el("div", { class: "card" }, el("h4", {}, m.id),
      el("div", { class: "bar" },
        el("button", { onclick: () => api("/api/m/" + enc(m.id + ".md")).then((r) => { text.textContent = r.text; }, (e) => say(e.message, true)) }, "read"),
        el("button", { class: "danger", onclick: () => confirm("Remove memory " + m.id + "?") &&
          api("/api/m/" + enc(m.id + ".md") + "/rm", {}).then(search, (e) => say(e.message, true)) }, "remove")),
      text);
  };
  q.addEventListener("keydown", (ev) => { if (ev.key === "Enter") search(); });
  main.replaceChildren(el("div", { class: "bar" }, q, el("button", { onclick: search }, "search")), list);
  search();
  return () => {};
}

// ---- tools and agents ------------------------------------------------------------------------------
function toolsView() {
  const box = el("div", { class: "cols" });
  main.replaceChildren(box);
  api("/api/tools").then((r) => {
    box.append(el("div", { class: "card" }, el("h4", {}, "t/idx: tool scripts"), el("pre", {}, r.tools || "(none)")));
    box.append(el("div", { class: "card" }, el("h4", {}, "sk/idx: skills"), el("pre", {}, r.skills || "(none)")));
    for (const [name, text] of Object.entries(r.agents)) {
      box.append(el("div", { class: "card" }, el("h4", {}, "a/" + name + ".json"), el("pre", {}, text)));
    }
  }, (e) => say(e.message, true));
  return () => {};
}

// ---- routes --------------------------------------------------------------------------------------
function route() {
  cleanup();
  say("");
  const h = location.hash.replace(/^#/, "") || "/";
  const parts = h.split("/").filter(Boolean).map(decodeURIComponent);
  let nav = "s";
  if (parts[0] === "s" && parts[1]) cleanup = pageView("s", parts[1]);
  else if (parts[0] === "b" && parts[1]) { nav = "b"; cleanup = pageView("b", parts[1]); }
  else if (parts[0] === "b") { nav = "b"; cleanup = jobsView(); }
  else if (parts[0] === "m") { nav = "m"; cleanup = memoryView(); }
  else if (parts[0] === "t") { nav = "t"; cleanup = toolsView(); }
  else cleanup = sessionsView();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("on", a.dataset.nav === nav);
}
window.addEventListener("hashchange", route);
route();
