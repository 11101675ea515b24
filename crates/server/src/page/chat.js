"use strict";
// The chat page: conversations (kept by K3Store), settings, images, and answers streamed from
// this server's /v1/chat/completions (K3Stream) by the model chosen (models.js), their markdown
// rendered by K3Markdown. Model
// text reaches the page only through K3Markdown and textContent: nothing here parses HTML.
const $ = (id) => document.getElementById(id);
const log = $("log"), promptBox = $("prompt"), key = $("key");
const MAX_IMAGES = 4, MAX_IMAGE_BYTES = 5 << 20, IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp"];
const RENDER_EVERY_MS = 80;

const model = { id: "", family: "", vision: false };
const settings = K3Store.loadSettings();
let conversations = K3Store.load();
let current = null; // the conversation shown
let run = null; // the answer streaming: { controller, conversation, message }
let attached = []; // data URLs of images for the next message
const liveNodes = new WeakMap(); // an answer under way: its progress/status line

const el = K3Markdown.el;

function button(label, cls, onClick) {
  const b = el("button", cls, label);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (key.value) h.Authorization = "Bearer " + key.value;
  return h;
}

async function errorText(r) {
  try { const j = await r.json(); return (j.error && j.error.message) || r.statusText; } catch { return r.statusText; }
}

// ---- conversations ----

function persist() {
  const dropped = K3Store.save(conversations, current && current.id);
  K3Store.saveShown(current && current.id);
  conversations = conversations.filter((c) => c.messages.length || c === current);
  const notes = [];
  if (dropped.conversations) notes.push(`${dropped.conversations} old conversation(s) dropped: the browser's storage is full`);
  if (dropped.images) notes.push(`${dropped.images} image(s) not kept: the browser's storage is full`);
  if (dropped.failed) notes.push("this conversation could not be kept: the browser's storage is full");
  if (notes.length) { $("storage").textContent = notes.join("; "); $("storage").hidden = false; }
  renderSidebar();
}

function renderSidebar() {
  const nav = $("conversations");
  nav.replaceChildren();
  for (const c of conversations.filter((c) => c.messages.length)) {
    const row = el("div", "conversation" + (c === current ? " current" : ""));
    row.appendChild(button(c.title, "open", () => switchTo(c)));
    row.appendChild(button("×", "delete", () => remove(c))).title = "Delete this conversation";
    nav.appendChild(row);
  }
}

function stopRun() {
  if (run) run.controller.abort();
}

function newChat() {
  stopRun();
  current = null;
  K3Store.saveShown(null);
  renderConversation();
  renderSidebar();
  promptBox.focus();
}

function switchTo(c) {
  if (c === current) return;
  stopRun();
  current = c;
  K3Store.saveShown(c.id);
  restoreModel(c);
  renderConversation();
  renderSidebar();
}

function remove(c) {
  if (run && run.conversation === c) stopRun();
  conversations = conversations.filter((x) => x !== c);
  if (c === current) current = null;
  persist();
  renderConversation();
}

// ---- messages ----

function renderConversation() {
  log.replaceChildren();
  if (current) current.messages.forEach((m, i) => log.appendChild(messageNode(m, i)));
  busy(!!run && run.conversation === current);
  log.scrollTop = log.scrollHeight;
}

function thumbnails(urls, cls) {
  const row = el("div", cls);
  for (const url of urls) {
    if (!url.startsWith("data:image/")) continue;
    const img = el("img", "thumb");
    img.src = url;
    img.alt = "attached image";
    row.appendChild(img);
  }
  return row;
}

function messageNode(m, i) {
  const box = el("div", "msg " + m.role);
  box.dataset.index = String(i);
  if (m.role === "user") {
    if (m.images.length) box.appendChild(thumbnails(m.images, "images"));
    if (m.dropped) box.appendChild(el("div", "dim", `(${m.dropped} image(s) not kept by the browser)`));
    box.appendChild(el("div", "text", m.text));
    const actions = el("div", "actions");
    actions.appendChild(button("Edit", "edit", () => edit(box, i)));
    box.appendChild(actions);
  } else {
    renderAnswer(box, m);
  }
  return box;
}

// (Re)renders an assistant message: thinking (collapsed), answer as markdown, meta, note.
function renderAnswer(box, m) {
  const open = box.querySelector("details") && box.querySelector("details").open;
  box.replaceChildren();
  if (m.reasoning) {
    const d = el("details", "thinking");
    d.open = !!open;
    d.appendChild(el("summary", "", "thinking"));
    d.appendChild(el("div", "thought", m.reasoning));
    box.appendChild(d);
  }
  const answer = el("div", "answer");
  answer.appendChild(K3Markdown.render(m.text));
  box.appendChild(answer);
  const live = liveNodes.get(m);
  if (live) box.appendChild(live);
  if (m.stats) box.appendChild(el("div", "meta", m.stats));
  if (m.note) box.appendChild(el("div", m.note.startsWith("Error") ? "error" : "note", m.note));
  if (!live) {
    const actions = el("div", "actions");
    actions.appendChild(button("Copy", "copy-answer", (e) => K3Markdown.copy(m.text, e.target)));
    if (current && m === current.messages[current.messages.length - 1]) actions.appendChild(button("Regenerate", "regenerate", regenerate));
    box.appendChild(actions);
  }
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  promptBox.disabled = on;
  $("model-pick").disabled = on;
  for (const b of log.querySelectorAll(".actions button.edit, .actions button.regenerate")) b.disabled = on;
}

function edit(box, i) {
  if (run) return;
  const m = current.messages[i];
  const area = el("textarea", "edit-text");
  area.value = m.text;
  const save = button("Save & send", "save", () => {
    const text = area.value.trim();
    if (!text && !m.images.length) return;
    current.messages = current.messages.slice(0, i);
    current.messages.push({ ...m, text });
    if (i === 0) current.title = title(text);
    renderConversation();
    answer();
  });
  const actions = el("div", "actions");
  actions.append(save, button("Cancel", "cancel", renderConversation));
  box.querySelector(".text").replaceWith(area);
  box.querySelector(".actions").replaceWith(actions);
  area.focus();
}

function regenerate() {
  if (run || !current) return;
  const last = current.messages[current.messages.length - 1];
  if (last && last.role === "assistant") current.messages.pop();
  renderConversation();
  answer();
}

const title = (text) => (text.replace(/\s+/g, " ").trim().slice(0, 48) || "Images");

function send(text) {
  if (!current) {
    current = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: title(text), updated: 0, messages: [] };
    conversations.unshift(current);
  }
  const images = model.vision ? attached : [];
  current.messages.push({ role: "user", text, images, reasoning: "", note: "", stats: "", dropped: 0 });
  attached = [];
  renderThumbs();
  renderConversation();
  answer();
}

// ---- an answer ----

function progressNode(p) {
  const wrap = el("div", "progress");
  const total = Math.max(1, p.total);
  const bar = el("progress");
  bar.max = total;
  bar.value = Math.min(p.processed, total);
  wrap.append(el("span", "", `Reading the prompt: ${p.processed} / ${p.total} tokens` + (p.cache ? ` (${p.cache} cached)` : "")), bar);
  return wrap;
}

// The answer's figures. The server sends token counts (usage) and the prompt's progress with
// its own times; the generation rate is timed here, from the network read that brought the
// prompt's end (else the first token) to the one that brought the last token, so it includes
// the network and says so. Tokens that all came in one read give no rate.
function stats(t) {
  const parts = [];
  // Without usage (the stream ended early) the deltas are counted: not quite tokens.
  const n = t.usage ? t.usage.completion_tokens : t.deltas;
  if (n) parts.push(t.usage ? `${n} tokens` : `${n} pieces`);
  const from = t.promptDone || t.firstDelta;
  const span = (t.lastDelta - from) / 1000;
  const counted = t.promptDone ? n : n - 1;
  if (counted > 0 && span > 0) parts.push(`${(counted / span).toFixed(1)} tok/s (timed in the browser)`);
  if (t.progress) {
    const p = t.progress, read = p.processed - p.cache, secs = p.time_ms / 1000;
    let s = `prompt ${p.total} tokens` + (p.cache ? `, ${p.cache} cached` : "") + `, ${read} read in ${secs.toFixed(2)} s`;
    if (read > 0 && p.time_ms > 0) s += ` (${(read / secs).toFixed(1)} tok/s)`;
    parts.push(s);
  }
  return parts.join(" · ");
}

async function answer() {
  const conversation = current;
  const m = { role: "assistant", text: "", reasoning: "", note: "", stats: "", images: [], dropped: 0 };
  // A model not loaded yet loads first: the request waits for it.
  const loading = loadingNote(model.id);
  liveNodes.set(m, el("div", "meta", loading || "Waiting for the server…"));
  const body = K3Stream.body(conversation.messages, settings, model);
  conversation.model = model.id;
  conversation.messages.push(m);
  conversation.updated = Date.now();
  persist();
  const controller = new AbortController();
  run = { controller, conversation, message: m };
  const shown = () => current === conversation;
  let box = null, timer = null;
  const draw = () => {
    timer = null;
    if (!shown()) return;
    box = box && box.isConnected ? box : log.querySelector(`.msg[data-index="${conversation.messages.indexOf(m)}"]`);
    // Follows the answer only while the reader is at the end (not reading further up).
    const following = log.scrollHeight - log.scrollTop - log.clientHeight < 48;
    if (box) renderAnswer(box, m);
    if (following) log.scrollTop = log.scrollHeight;
  };
  const later = () => { if (!timer) timer = setTimeout(draw, RENDER_EVERY_MS); };
  renderConversation();
  const t = { start: performance.now(), deltas: 0, usage: null, progress: null, promptDone: 0, firstDelta: 0, lastDelta: 0 };
  let finish = null;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), signal: controller.signal, body: JSON.stringify(body) });
    if (!r.ok) throw new Error(await errorText(r));
    modelLoaded(body.model);
    if (!loading) { liveNodes.set(m, el("div", "meta", "Reading the prompt…")); later(); }
    await K3Stream.read(r, {
      progress(p, at) {
        t.progress = p;
        if (p.processed >= p.total) t.promptDone = at;
        liveNodes.set(m, progressNode(p));
        // Drawn at once: there are few (one per prefill step) and the first token may follow fast.
        if (timer) clearTimeout(timer);
        draw();
      },
      delta(d, now) {
        if (!t.firstDelta) { t.firstDelta = now; liveNodes.set(m, el("div", "meta", t.progress ? `Prompt read (${t.progress.total} tokens); writing…` : "Writing…")); }
        t.lastDelta = now;
        t.deltas++;
        m.text += d.content;
        m.reasoning += d.reasoning;
        later();
      },
      finish(reason) { finish = reason; },
      usage(u) { t.usage = u; },
    });
    if (finish === "length") m.note = "(the answer was cut at its length limit)";
  } catch (e) {
    m.note = e.name === "AbortError" ? "(stopped)" : "Error: " + e.message;
  } finally {
    if (t.lastDelta) m.stats = stats(t);
    liveNodes.delete(m);
    if (timer) clearTimeout(timer);
    run = null;
    conversation.updated = Date.now();
    persist();
    if (shown()) { renderConversation(); promptBox.focus(); }
  }
}
