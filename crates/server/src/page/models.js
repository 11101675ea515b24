"use strict";
// The models this server offers (/v1/models) and the one requests go to. A server started
// without --model offers every stored model and loads the one asked for: with more than one
// the page shows a picker (the shown conversation's model, else the choice remembered, else
// the loaded model, else the first). The choice is kept in the browser's storage and with each
// conversation (switching to one brings its model back); the image input and the thinking
// switch follow the chosen model's `vision` and `family`.
const CHOSEN = "k3-model";
let offered = []; // [{ id, family, vision }]
let loadedId = ""; // the model the server has loaded, as far as the page knows

const findModel = (id) => offered.find((m) => m.id === id);

function describeModel(m) {
  return { id: String(m.id), family: String(m.family || ""), vision: m.vision === true };
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) { modelText(r.status === 401 ? "enter the API key" : await errorText(r)); return; }
    const data = (await r.json()).data;
    if (!Array.isArray(data) || !data.length) { modelText("no model offered"); return; }
    offered = data.filter((m) => m && typeof m.id === "string").map(describeModel);
    // /v1/models gives the shape (context_length) of the loaded model only.
    const loaded = data.find((m) => m && m.context_length !== undefined);
    loadedId = loaded ? String(loaded.id) : "";
    fillPicker();
    const remembered = K3Store.get(CHOSEN);
    // The shown conversation's model, else the one chosen last, else the loaded one, else the first.
    chooseModel(findModel(current && current.model) || findModel(remembered) || findModel(loadedId) || offered[0]);
  } catch { modelText("server unreachable"); }
}

// No model to pick: the header says why.
function modelText(text) {
  Object.assign(model, { id: "", family: "", vision: false });
  $("model").textContent = text;
  $("model").hidden = false;
  $("model-pick").hidden = true;
  followModel();
}

function fillPicker() {
  const pick = $("model-pick");
  pick.replaceChildren(...offered.map((m) => {
    const o = el("option", "", m.id + (m.id === loadedId ? " (loaded)" : ""));
    o.value = m.id;
    return o;
  }));
  pick.hidden = offered.length < 2;
  $("model").hidden = offered.length >= 2;
}

// Makes `m` the model requests go to, and the remembered choice.
function chooseModel(m) {
  if (!m) return;
  Object.assign(model, m);
  $("model").textContent = m.id;
  $("model-pick").value = m.id;
  K3Store.put(CHOSEN, m.id);
  followModel();
}

// The image input and the thinking switch follow the model.
function followModel() {
  $("vision").hidden = !model.vision;
  $("attach").hidden = !model.vision;
  if (!model.vision && attached.length) { attached = []; renderThumbs(); }
  showSettings();
}

// A conversation's model, while it is still offered, becomes the choice again.
function restoreModel(c) {
  const m = c && findModel(c.model);
  if (m && m.id !== model.id) chooseModel(m);
}

// A request for `id` was answered: the server has it loaded now.
function modelLoaded(id) {
  if (!id || id === loadedId) return;
  loadedId = id;
  if (offered.length > 1) {
    for (const o of $("model-pick").options) o.textContent = o.value + (o.value === id ? " (loaded)" : "");
  }
}

// While a model other than the loaded one loads, a request waits: what its status says.
function loadingNote(id) {
  return offered.length > 1 && id && id !== loadedId ? `Loading ${id}…` : "";
}

// A model picked in a conversation is its model from now on.
$("model-pick").addEventListener("change", () => {
  const m = findModel($("model-pick").value);
  chooseModel(m);
  if (m && current) {
    current.model = m.id;
    if (current.messages.length) persist();
  }
});
