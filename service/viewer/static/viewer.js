// The viewer's state, its URL, its controls and the drawing of the current view.
//
// One-way flow: controls and the URL set `state`; show() asks the server for exactly the
// maps the view needs (cached per input), then draw() renders them. The summaries view
// asks for no maps at all, only per-head numbers: the way into a long input.

import {
  apiKey, countTokens, embedSparse, encodeAttention, encodeSummaries, explainMaxSim,
  explainRank, explainSimilarity, listModels, setApiKey,
} from "./api.js";
import { maxOf, spreadTopK, viewImage } from "./heatmap.js";
import { cellSize, draw, select, thumbnailSize, zoom } from "./mapview.js";
import { drawMatch } from "./match.js";
import { drawMaxSim } from "./maxsim.js";
import { parseNpy } from "./npy.js";
import { drawRank } from "./rank.js";
import { $, element, state } from "./state.js";
import { SUMMARIES } from "./summaries.js";

const VIEWS = ["summaries", "head", "grid", "mean", "rollout"];
const LONG = 256; // "auto": past this many tokens a map keeps only each row's top AUTO_K
const AUTO_K = 32;
const TOP_PAIRS = 20; // the match view's lines
const CACHE_SIZE = 16;

const cache = new Map(); // request -> promise of encodeAttention's (or encodeSummaries') answer
const counts = new Map(); // input (and truncation) -> promise of its token count
let asked = 0; // the latest show(): an older answer arriving late is dropped

// ---------- what to ask for ----------

function inputOf() {
  return state.npy ?? $("text").value;
}

function inputKey() {
  return state.npy ? `npy:${state.npy.id}` : `text:${$("text").value}`;
}

/** The attention selection of a view: only the maps it draws, weights or norms, each
 * row's top k keys only when ``k`` is a number. */
function selectionFor(view, layer, head, k) {
  const more = { ...($("norms").checked ? { measure: "norms" } : {}), ...(k ? { top_k: k } : {}) };
  if (view === "grid") return { layers: [layer], reduce: "none", ...more };
  if (view === "head") return { layers: [layer], heads: [head], reduce: "none", ...more };
  if (view === "mean") return { layers: [layer], reduce: "mean", ...more };
  // first layer up to this one
  return { layers: [...Array(layer + 1).keys()], reduce: "rollout", ...more };
}

/** The k of the maps to ask for: null for whole maps. "auto" keeps whole maps up to LONG
 * tokens; a k is never more than the input's tokens (the server refuses k > n). */
async function topK() {
  if (state.topk === "all") return null;
  const n = await tokenCount();
  if (state.topk === "auto") return n > LONG ? Math.min(AUTO_K, n) : null;
  return Math.min(state.topk, n);
}

/** The input's token count: an upload's rows, else the tokenizer's answer (asked once). */
function tokenCount() {
  if (state.npy) return Promise.resolve(state.npy.shape[0]);
  const key = countKey();
  if (!counts.has(key)) {
    const count = countTokens(state.model.id, $("text").value, $("truncate").checked);
    count.catch(() => counts.delete(key));
    counts.set(key, count);
  }
  return counts.get(key);
}

function countKey() {
  return JSON.stringify([state.model.id, inputKey(), $("truncate").checked]);
}

/** The cache's key of a request: everything its answer depends on. */
function requestKey(selection) {
  return JSON.stringify([state.model.id, inputKey(), selection, $("truncate").checked]);
}

function fetchSelection(selection) {
  const key = requestKey(selection);
  if (!cache.has(key)) {
    const ask = selection.maps === false ? encodeSummaries : encodeAttention;
    const what = selection.maps === false ? selection.summaries : selection;
    const answer = ask(state.model.id, inputOf(), what, $("truncate").checked);
    answer.catch(() => cache.delete(key)); // errors are not kept: the next try asks again
    cache.set(key, answer);
    if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value);
  }
  return cache.get(key);
}

/** The maps of the current view, as [n * n] arrays, with their labels and captions. */
async function fetchView() {
  const { view, layer, head } = state;
  if (view === "summaries") {
    const answer = await fetchSelection({ summaries: Object.keys(SUMMARIES), maps: false });
    const n = answer.tokens?.length ?? (state.npy ? state.npy.shape[0] : 0);
    if (answer.tokens) counts.set(countKey(), Promise.resolve(n)); // a map's k needs no tokenize
    return { labels: answer.tokens ?? [...Array(n).keys()].map((i) => `#${i}`), summaries: answer.summaries, n, title: titleOf(n, null) };
  }
  const k = await topK();
  // One head of a layer whose heads are all here already costs no request.
  const fromGrid = view === "head" && cache.has(requestKey(selectionFor("grid", layer, head, k)));
  const answer = await fetchSelection(selectionFor(fromGrid ? "grid" : view, layer, head, k));
  const [, heads, n, kept] = answer.shape;
  const maps = answer.indices
    ? spreadTopK(answer.values, answer.indices, heads, n, kept)
    : [...Array(heads).keys()].map((h) => answer.values.subarray(h * n * n, (h + 1) * n * n));
  const labels = answer.tokens ?? [...Array(n).keys()].map((i) => `#${i}`);
  const shown = fromGrid ? [maps[head]] : maps;
  const captions = view === "grid" ? maps.map((_, h) => `head ${h}`) : [];
  const topk = answer.indices ? kept : null;
  return { labels, maps: shown, captions, n, topk, vmax: maxOf(shown), title: titleOf(n, topk) };
}

function titleOf(n, topk) {
  const { model, view, layer, head } = state;
  const what = {
    summaries: `per-head summaries of ${model.layers} layers × ${model.heads} heads: click one to see its map`,
    head: `layer ${layer}, head ${head}`,
    grid: `layer ${layer}, all ${model.heads} heads`,
    mean: `layer ${layer}, mean of ${model.heads} heads`,
    rollout: `rollout through layers 0-${layer}`,
  }[view];
  const source = state.npy ? state.npy.name : "text";
  const cut = !state.npy && n === model.max_seq_len && $("truncate").checked ? " (the model's limit: longer text is cut)" : "";
  const sparse = topk ? ` · each row's top ${topk} keys` : "";
  return `${model.id} · ${source} · ${n} tokens${cut} · ${what}${sparse}`;
}

// ---------- showing it ----------

async function show() {
  if (!state.model) return;
  writeUrl();
  if (!state.npy && !state.model.tokenizer) {
    return status(`${state.model.id} takes token embeddings only: choose a .npy file`, "error");
  }
  if (!state.npy && !$("text").value.trim()) return status("type a text first", "error");
  const mine = ++asked;
  status("asking the server…", "busy");
  try {
    const shown = await fetchView();
    if (mine !== asked) return;
    if (state.shown?.labels.join("\u0000") !== shown.labels.join("\u0000")) {
      state.selected = null;
      if (state.shown?.n !== shown.n) state.cell = null; // a new length: the fitting zoom
    }
    state.shown = shown;
    draw(openHead);
    status(shown.title, "ready");
    if (state.view === "summaries") $("download").disabled = true; // the PNG is of maps
  } catch (error) {
    if (mine === asked) status(error.message, "error");
  }
}

/** The text's BM42 weights as a table, largest first, each with a bar of its share. */
async function showBm42() {
  if (!state.model?.tokenizer || state.npy) {
    return status("BM42 weights need a text and a model with a tokenizer", "error");
  }
  status("asking the server…", "busy");
  try {
    const vector = await embedSparse(state.model.id, $("text").value, $("truncate").checked);
    const rows = vector.text.map((stem, k) => ({ stem, value: vector.values[k], index: vector.indices[k] }));
    rows.sort((a, b) => b.value - a.value);
    const top = rows.length ? rows[0].value : 1;
    $("bm42-rows").replaceChildren(
      ...rows.map(({ stem, value, index }) => {
        const row = element("tr");
        const bar = element("span", "bar");
        bar.style.width = `${Math.round((100 * value) / top)}%`;
        const weight = element("td");
        weight.append(bar, ` ${value.toFixed(4)}`);
        row.append(cell(stem), weight, cell(String(index)));
        row.dataset.stem = stem;
        return row;
      }),
    );
    $("bm42").hidden = false;
    status(`BM42: ${rows.length} stems`, "ready");
  } catch (error) {
    status(error.message, "error");
  }
}

/** A reranker's answer for the query and the text (the document), and why it ranked:
 * the chosen layer's attention from query tokens to document tokens. */
async function showRank() {
  const query = $("query").value.trim();
  if (!query || !$("text").value.trim()) return status("type a query and a document", "error");
  if (state.model.late_interaction) return showMaxSim(query);
  const oneHead = state.view === "head" || state.view === "summaries"; // a head is chosen
  const attention = oneHead
    ? { layers: [state.layer], heads: [state.head], reduce: "none" }
    : { layers: [state.layer], reduce: "mean" };
  if ($("norms").checked) attention.measure = "norms";
  status("asking the server…", "busy");
  try {
    const result = await explainRank(state.model.id, query, $("text").value, attention, $("truncate").checked);
    drawRank($("stage"), result, 0);
    $("stage").dataset.view = "rank";
    $("readout").textContent = "hover a line to read its weight";
    const what = oneHead ? `layer ${state.layer}, head ${state.head}` : `layer ${state.layer}, head mean`;
    status(`${state.model.id} · query → document attention · ${what}`, "ready");
    $("download").disabled = true; // the PNG is of heatmaps
  } catch (error) {
    status(error.message, "error");
  }
}

/** Why a multi-vector model ranked the text (the document) so for the query: each query
 * token joined to its best document token by that match's term of the MaxSim score. */
async function showMaxSim(query) {
  const mine = ++asked;
  status("asking the server…", "busy");
  try {
    const result = await explainMaxSim(state.model.id, query, $("text").value, $("truncate").checked);
    if (mine !== asked) return;
    drawMaxSim($("stage"), result);
    $("stage").dataset.view = "maxsim";
    for (const radio of document.querySelectorAll("input[name=view]")) radio.checked = false;
    $("zoom").hidden = true;
    $("readout").textContent = "hover a line or a token to read its term and its share of the score";
    status(`${state.model.id} · query → document: the MaxSim score split into each query token's best match`, "ready");
    $("download").disabled = true; // the PNG is of heatmaps
  } catch (error) {
    if (mine === asked) status(error.message, "error");
  }
}

/** Why the text and the second text match (mean-pooled models): their token pairs joined
 * by each pair's share of the cosine, as /v1/explain/similarity splits it. */
async function showMatch() {
  if (!$("text").value.trim() || !$("other").value.trim()) return status("type two texts", "error");
  const mine = ++asked;
  status("asking the server…", "busy");
  try {
    const result = await explainSimilarity(
      state.model.id, $("text").value, $("other").value, TOP_PAIRS, $("truncate").checked,
    );
    if (mine !== asked) return;
    drawMatch($("stage"), result);
    $("stage").dataset.view = "match";
    // None of the attention views is on show: no radio stays checked, and a click on any
    // of them (the one last checked too) goes back to that view.
    for (const radio of document.querySelectorAll("input[name=view]")) radio.checked = false;
    $("zoom").hidden = true;
    $("readout").textContent = "hover a line or a token to read its share of the score";
    status(`${state.model.id} · text → second text: the cosine split into token pairs (mean pooling)`, "ready");
    $("download").disabled = true; // the PNG is of heatmaps
  } catch (error) {
    if (mine === asked) status(error.message, "error");
  }
}

/** A click on a summaries cell or a grid thumbnail: that layer's head, as one map. */
function openHead(layer, head) {
  Object.assign(state, { layer, head, view: "head" });
  syncControls();
  show();
}

function cell(text) {
  const td = element("td");
  td.textContent = text;
  return td;
}

function status(text, kind) {
  $("status").textContent = text;
  $("status").dataset.state = kind;
  $("stage").dataset.state = kind;
  $("download").disabled = kind !== "ready";
}

// ---------- the URL: ?text=&model=&layer=&head=&view=&summary=&topk= ----------

function readUrl() {
  const params = new URLSearchParams(location.search);
  const named = state.models.find((m) => m.id === params.get("model"));
  setModel(named ?? state.models.find((m) => m.default) ?? state.models[0]);
  if (params.has("text")) $("text").value = params.get("text");
  state.layer = indexIn(params.get("layer"), state.model.layers);
  state.head = indexIn(params.get("head"), state.model.heads);
  state.view = VIEWS.includes(params.get("view")) ? params.get("view") : "summaries";
  state.summary = Object.hasOwn(SUMMARIES, params.get("summary") ?? "") ? params.get("summary") : "entropy";
  state.topk = topkOf(params.get("topk") ?? "auto");
  $("norms").checked = params.get("measure") === "norms";
}

/** A layer or head index from the URL: negative counts from the end; anything else is 0. */
function indexIn(text, count) {
  const value = Number.parseInt(text ?? "0", 10);
  if (Number.isNaN(value) || value >= count || value < -count) return 0;
  return value < 0 ? count + value : value;
}

/** "auto", "all" or a whole number of keys (anything else: auto). */
function topkOf(text) {
  if (text === "all") return "all";
  const k = Number.parseInt(text, 10);
  return k >= 1 ? k : "auto";
}

function writeUrl() {
  const params = new URLSearchParams();
  if (!state.npy) params.set("text", $("text").value); // an uploaded file cannot be linked
  params.set("model", state.model.id);
  params.set("layer", state.layer);
  params.set("head", state.head);
  params.set("view", state.view);
  if (state.view === "summaries") params.set("summary", state.summary);
  if (state.topk !== "auto") params.set("topk", state.topk);
  if ($("norms").checked) params.set("measure", "norms");
  history.replaceState(null, "", `?${params}`);
}

// ---------- controls ----------

function setModel(card) {
  state.model = card;
  const options = (count, name) =>
    [...Array(count).keys()].map((i) => new Option(`${name} ${i}`, i));
  $("layer").replaceChildren(...options(card.layers, "layer"));
  $("head").replaceChildren(...options(card.heads, "head"));
  state.layer = Math.min(state.layer, card.layers - 1);
  state.head = Math.min(state.head, card.heads - 1);
  $("text").disabled = !card.tokenizer;
  const reranks = card.task === "rerank" || card.late_interaction; // a MaxSim rerank too
  $("query-row").hidden = !reranks;
  $("show-rank").hidden = !reranks;
  const matches = card.tokenizer && card.pooling === "mean" && !reranks; // explain/similarity
  $("other-row").hidden = !matches;
  $("show-match").hidden = !matches;
  $("text").title = card.tokenizer ? "" : `${card.id} has no tokenizer: upload token embeddings`;
}

function syncControls() {
  $("model").value = state.model.id;
  $("layer").value = state.layer;
  $("head").value = state.head;
  $("head").disabled = state.view !== "head" && state.view !== "summaries";
  $("summary").value = state.summary;
  $("summary").disabled = state.view !== "summaries";
  $("topk").value = String(state.topk);
  $("topk").disabled = state.view === "summaries";
  $("norms").disabled = state.view === "summaries"; // summaries are of the weights
  for (const radio of document.querySelectorAll("input[name=view]")) radio.checked = radio.value === state.view;
  $("clear-npy").hidden = !state.npy;
}

async function chooseFile(file) {
  try {
    const { shape, values } = parseNpy(await file.arrayBuffer());
    if (shape[1] !== state.model.d_model) {
      throw new Error(`width ${shape[1]} does not match ${state.model.id}'s d_model ${state.model.d_model}`);
    }
    state.npy = { id: `${file.name}:${file.size}:${file.lastModified}`, name: file.name, shape, values };
    syncControls();
    show();
  } catch (error) {
    $("npy").value = "";
    status(`${file.name}: ${error.message}`, "error");
  }
}

function download() {
  const { labels, maps, captions, n, vmax, title } = state.shown;
  const single = state.view !== "grid";
  const image = viewImage({
    title,
    labels,
    maps,
    captions,
    vmax,
    selected: single ? state.selected : null,
    cell: state.cell ?? cellSize(n), // as zoomed
    thumbnail: thumbnailSize(n),
  });
  const name = `attention-${state.model.id}-${state.view}-layer${state.layer}` +
    `${state.view === "head" ? `-head${state.head}` : ""}.png`;
  image.toBlob((blob) => {
    const link = element("a");
    link.href = URL.createObjectURL(blob);
    link.download = name;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
  }, "image/png");
}

function wire() {
  $("controls").addEventListener("submit", (event) => {
    event.preventDefault();
    show();
  });
  $("model").addEventListener("change", () => {
    setModel(state.models.find((m) => m.id === $("model").value));
    state.npy = null;
    $("npy").value = "";
    syncControls();
    show();
  });
  $("layer").addEventListener("change", () => {
    state.layer = Number($("layer").value);
    show();
  });
  $("head").addEventListener("change", () => {
    state.head = Number($("head").value);
    show();
  });
  for (const radio of document.querySelectorAll("input[name=view]")) {
    radio.addEventListener("change", () => {
      state.view = radio.value;
      syncControls();
      show();
    });
  }
  $("summary").addEventListener("change", () => {
    state.summary = $("summary").value;
    writeUrl();
    if (state.view === "summaries" && state.shown?.summaries) draw(openHead); // already here: no request
    else show();
  });
  $("topk").addEventListener("change", () => {
    state.topk = topkOf($("topk").value);
    show();
  });
  $("zoom-in").addEventListener("click", () => zoom(1));
  $("zoom-out").addEventListener("click", () => zoom(-1));
  $("zoom-fit").addEventListener("click", () => zoom("fit"));
  $("show-match").addEventListener("click", showMatch);
  $("truncate").addEventListener("change", show);
  $("norms").addEventListener("change", show);
  $("npy").addEventListener("change", () => $("npy").files[0] && chooseFile($("npy").files[0]));
  $("clear-npy").addEventListener("click", () => {
    state.npy = null;
    $("npy").value = "";
    syncControls();
    show();
  });
  $("download").addEventListener("click", download);
  $("show-bm42").addEventListener("click", showBm42);
  $("show-rank").addEventListener("click", showRank);
  $("api-key").value = apiKey();
  $("api-key").addEventListener("change", () => {
    setApiKey($("api-key").value.trim());
    cache.clear();
    counts.clear();
    if (state.models.length) show();
    else start();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.selected !== null) select(state.selected);
  });
}

async function start() {
  try {
    state.models = await listModels();
  } catch (error) {
    const hint = error.status === 401 ? " (enter the server's API key above)" : "";
    return status(`could not list the models: ${error.message}${hint}`, "error");
  }
  $("model").replaceChildren(...state.models.map((m) => new Option(m.id, m.id)));
  $("summary").replaceChildren(...Object.entries(SUMMARIES).map(([name, meaning]) => {
    const option = new Option(name, name);
    option.title = meaning;
    return option;
  }));
  readUrl();
  syncControls();
  show();
}

wire();
start();
