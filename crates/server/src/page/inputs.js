"use strict";
// The chat page's inputs: the settings panel (kept by K3Store), images by button, paste and
// drop (only for a model that reads images), the composer and the page's buttons.

// Input id: settings key (the thinking budget is kept under its old name, `allowance`).
const FIELDS = { system: "system", temperature: "temperature", top_p: "top_p", max: "max_answer", effort: "effort", budget: "allowance" };

function showSettings() {
  for (const [id, k] of Object.entries(FIELDS)) if ($(id).value !== settings[k]) $(id).value = settings[k];
  $("thinking").checked = settings.thinking;
  const switchable = K3Stream.switchable(model);
  $("thinking-set").disabled = !switchable;
  for (const label of $("thinking-set").querySelectorAll("label")) label.hidden = !switchable;
  $("thinking-note").textContent = switchable
    ? "Off sends reasoning_effort none; on sends the effort chosen and the thinking budget."
    : "This model's chat format has no thinking switch: nothing is sent for it.";
  const budget = K3Stream.thinkingBudget(settings, model);
  const sent = K3Stream.maxTokens(settings, model);
  const answer = sent === undefined ? "" : String(sent - (budget || 0));
  let text = "max_tokens is the answer's limit" + (sent ? ` (${sent})` : " (none)") + ".";
  if (budget !== null) {
    text = `thinking_budget = ${budget}: at most ${budget} tokens of thinking, then the model answers. ` +
      "The server counts thinking inside max_tokens, so the page sends max_tokens = max answer tokens + thinking budget " +
      (sent ? `= ${answer} + ${budget} = ${sent}` : "(no limit while the answer has none)") +
      ": the answer gets its tokens (less the few that close the thinking), and what the thinking leaves unused.";
  } else if (switchable && settings.thinking) {
    text = "No thinking budget: the thinking is not cut short, and max_tokens" + (sent ? ` (${sent})` : " (none)") +
      " counts thinking and answer together.";
  }
  $("max-note").textContent = text;
}

function bindSettings() {
  const save = () => {
    for (const [id, k] of Object.entries(FIELDS)) settings[k] = $(id).value;
    settings.thinking = $("thinking").checked;
    K3Store.saveSettings(settings);
    showSettings();
  };
  for (const id of [...Object.keys(FIELDS), "thinking"]) {
    $(id).addEventListener("input", save);
    $(id).addEventListener("change", save);
  }
  $("settings-button").addEventListener("click", () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-button").setAttribute("aria-expanded", String(open));
  });
  showSettings();
}

// ---- images ----

function note(text) {
  const n = el("div", "error", text);
  $("thumbs").appendChild(n);
  setTimeout(() => n.remove(), 6000);
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result));
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

async function attach(files) {
  if (!model.vision) return;
  for (const file of files) {
    if (attached.length >= MAX_IMAGES) { note(`At most ${MAX_IMAGES} images a message.`); break; }
    if (!IMAGE_TYPES.includes(file.type)) { note(`${file.name || "that file"}: the server reads PNG, JPEG and WebP images.`); continue; }
    if (file.size > MAX_IMAGE_BYTES) { note(`${file.name || "that image"} is over ${MAX_IMAGE_BYTES >> 20} MB.`); continue; }
    const url = await readImage(file);
    if (/^data:image\/(png|jpeg|webp);base64,/.test(url)) attached.push(url);
  }
  renderThumbs();
}

function renderThumbs() {
  const box = $("thumbs");
  box.replaceChildren();
  attached.forEach((url, i) => {
    const item = el("div", "attached");
    const img = el("img", "thumb");
    img.src = url;
    img.alt = "image to send";
    item.append(img, button("×", "unattach", () => { attached.splice(i, 1); renderThumbs(); }));
    box.appendChild(item);
  });
}

function bindImages() {
  $("attach").addEventListener("click", () => $("file").click());
  $("file").addEventListener("change", () => { attach([...$("file").files]); $("file").value = ""; });
  promptBox.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])].filter((f) => f.type.startsWith("image/"));
    if (files.length && model.vision) { e.preventDefault(); attach(files); }
  });
  const main = $("main");
  const hasFiles = (e) => e.dataTransfer && [...e.dataTransfer.types].includes("Files");
  main.addEventListener("dragover", (e) => {
    if (!model.vision || !hasFiles(e)) return;
    e.preventDefault();
    $("drop-hint").hidden = false;
  });
  main.addEventListener("dragleave", () => { $("drop-hint").hidden = true; });
  main.addEventListener("drop", (e) => {
    $("drop-hint").hidden = true;
    if (!model.vision || !hasFiles(e)) return;
    e.preventDefault();
    attach([...e.dataTransfer.files]);
  });
}

// ---- the page ----

key.value = K3Store.get("k3-key") || "";
key.addEventListener("change", () => { K3Store.put("k3-key", key.value); loadModel(); });
$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = promptBox.value.trim();
  if ((!text && !attached.length) || run) return;
  promptBox.value = "";
  send(text);
});
promptBox.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", stopRun);
$("new").addEventListener("click", newChat);
bindSettings();
bindImages();
current = K3Store.loadShown(conversations);
renderConversation();
renderSidebar();
loadModel();
promptBox.focus();
