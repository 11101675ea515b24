"use strict";
// What the chat page keeps in the browser's localStorage: the conversations (newest first, at
// most MAX_CONVERSATIONS), the one shown, and the settings. Storage is small (a few MB per origin) and images
// are large, so a save that hits the quota drops the oldest conversations, then the images of
// the one being saved, rather than losing the conversation the user is in. Stored data is
// read defensively (anything malformed is skipped) and only ever shown as text.
const K3Store = (() => {
  const CONVERSATIONS = "k3-conversations";
  const SETTINGS = "k3-settings";
  const SHOWN = "k3-shown";
  const MAX_CONVERSATIONS = 100;
  const DEFAULTS = Object.freeze({
    system: "", temperature: "", top_p: "", max_answer: "", thinking: true, effort: "max", allowance: "8192", // allowance: the thinking budget
  });

  const text = (v) => (typeof v === "string" ? v : "");

  function cleanMessage(m) {
    if (!m || (m.role !== "user" && m.role !== "assistant")) return null;
    const images = Array.isArray(m.images) ? m.images.filter((u) => typeof u === "string" && u.startsWith("data:image/")) : [];
    return {
      role: m.role, text: text(m.text), reasoning: text(m.reasoning), note: text(m.note), stats: text(m.stats),
      images, dropped: Number.isInteger(m.dropped) ? m.dropped : 0,
    };
  }

  function load() {
    let list;
    try { list = JSON.parse(localStorage.getItem(CONVERSATIONS) || "[]"); } catch { list = []; }
    if (!Array.isArray(list)) return [];
    return list
      .filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages))
      .map((c) => ({
        id: c.id, title: text(c.title) || "New chat", updated: Number(c.updated) || 0, model: text(c.model),
        messages: c.messages.map(cleanMessage).filter(Boolean),
      }))
      .sort((a, b) => b.updated - a.updated);
  }

  function write(list) {
    localStorage.setItem(CONVERSATIONS, JSON.stringify(list));
  }

  function isQuota(e) {
    return e && (e.name === "QuotaExceededError" || e.name === "NS_ERROR_DOM_QUOTA_REACHED" || e.code === 22);
  }

  // Saves `list` (newest first); on a full store drops the oldest conversations other than
  // `keep`, then `keep`'s images (counted in each message's `dropped`). What was dropped (and
  // whether even that did not make room) is returned, to tell the user.
  function save(list, keep) {
    list.sort((a, b) => b.updated - a.updated);
    list.splice(MAX_CONVERSATIONS);
    const dropped = { conversations: 0, images: 0, failed: false };
    for (;;) {
      try { write(list); return dropped; } catch (e) {
        if (!isQuota(e)) return dropped;
      }
      const others = list.filter((c) => c.id !== keep);
      if (others.length) { list.splice(list.indexOf(others[others.length - 1]), 1); dropped.conversations++; continue; }
      const current = list.find((c) => c.id === keep);
      const withImages = current && current.messages.find((m) => m.images.length);
      if (!withImages) return { ...dropped, failed: true };
      withImages.dropped += withImages.images.length;
      dropped.images += withImages.images.length;
      withImages.images = [];
    }
  }

  // The conversation shown, kept so a reload shows it again (with its model).
  function saveShown(id) {
    try { localStorage.setItem(SHOWN, id || ""); } catch { /* full: the newest is shown next time */ }
  }

  function loadShown(list) {
    let id = null;
    try { id = localStorage.getItem(SHOWN); } catch { /* no storage */ }
    if (id === "") return null;
    return list.find((c) => c.id === id) || list[0] || null;
  }

  function loadSettings() {
    let s;
    try { s = JSON.parse(localStorage.getItem(SETTINGS) || "{}"); } catch { s = {}; }
    const out = { ...DEFAULTS };
    for (const k of Object.keys(DEFAULTS)) {
      if (s && typeof s[k] === typeof DEFAULTS[k]) out[k] = s[k];
    }
    // The page before settings kept its max-tokens field alone.
    const old = get("k3-max");
    if (old && !(s && s.max_answer)) out.max_answer = old;
    return out;
  }

  // One value by key; a store the browser blocks (SecurityError) or that is full keeps nothing.
  function get(key) {
    try { return localStorage.getItem(key); } catch { return null; }
  }

  function put(key, value) {
    try { localStorage.setItem(key, value); } catch { /* blocked or full: kept for this visit */ }
  }

  function saveSettings(s) {
    try { localStorage.setItem(SETTINGS, JSON.stringify(s)); } catch { /* full: settings stay for this visit */ }
  }

  return { load, save, saveShown, loadShown, loadSettings, saveSettings, get, put, DEFAULTS };
})();
