// The viewer's state, its URL, its controls and the drawing of the current view.
//
// One-way flow: controls and the URL set `state`; show() asks the server for exactly the
// maps the view needs (cached per input), then draw() renders them.

import { apiKey, embedSparse, encodeAttention, explainRank, listModels, setApiKey } from "./api.js";
import { colourOf, drawMap, drawScale, drawThumbnail, maxOf, viewImage } from "./heatmap.js";
import { parseNpy } from "./npy.js";
import { drawRank } from "./rank.js";

const VIEWS = ["head", "grid", "mean", "rollout"];
const MAP_PIXELS = 640; // a map wider than this scrolls, its labels kept in view
const MIN_CELL = 12; // the smallest cell whose token label stays readable
const MAX_CELL = 28;
const THUMBNAIL = 160; // grid thumbnails: whole cells up to this size, averaged beyond
const CACHE_SIZE = 16;

const $ = (id) => document.getElementById(id);
const state = {
  models: [],
  model: null, // the chosen model's card from /v1/models
  layer: 0,
  head: 0,
  view: "head",
  npy: null, // {name, shape, values} when token embeddings were uploaded
  selected: null, // the clicked token, highlighted in the single-map views
  cursor: null, // the cell the keyboard is on: {i, j}
  shown: null, // what draw() renders: {labels, maps, captions, n, vmax, title}
};
const cache = new Map(); // request -> promise of encodeAttention's answer
let asked = 0; // the latest show(): an older answer arriving late is dropped

// ---------- what to ask for ----------

function inputOf() {
  return state.npy ?? $("text").value;
}

function inputKey() {
  return state.npy ? `npy:${state.npy.id}` : `text:${$("text").value}`;
}

/** The attention selection of a view: only the maps it draws, weights or norms. */
function selectionFor(view, layer, head) {
  const norms = $("norms").checked ? { measure: "norms" } : {};
  if (view === "grid") return { layers: [layer], reduce: "none", ...norms };
  if (view === "head") return { layers: [layer], heads: [head], reduce: "none", ...norms };
  if (view === "mean") return { layers: [layer], reduce: "mean", ...norms };
  // first layer up to this one
  return { layers: [...Array(layer + 1).keys()], reduce: "rollout", ...norms };
}

/** The cache's key of a request: everything its answer depends on. */
function requestKey(selection) {
  return JSON.stringify([state.model.id, inputKey(), selection, $("truncate").checked]);
}

function fetchSelection(selection) {
  const key = requestKey(selection);
  if (!cache.has(key)) {
    const answer = encodeAttention(state.model.id, inputOf(), selection, $("truncate").checked);
    answer.catch(() => cache.delete(key)); // errors are not kept: the next try asks again
    cache.set(key, answer);
    if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value);
  }
  return cache.get(key);
}

/** The maps of the current view, as [n * n] arrays, with their labels and captions. */
async function fetchView() {
  const { view, layer, head } = state;
  // One head of a layer whose heads are all here already costs no request.
  const fromGrid = view === "head" && cache.has(requestKey(selectionFor("grid", layer, head)));
  const answer = await fetchSelection(selectionFor(fromGrid ? "grid" : view, layer, head));
  const [, heads, n] = answer.shape;
  const maps = [...Array(heads).keys()].map((h) => answer.values.subarray(h * n * n, (h + 1) * n * n));
  const labels = answer.tokens ?? [...Array(n).keys()].map((i) => `#${i}`);
  const shown = fromGrid ? [maps[head]] : maps;
  const captions = view === "grid" ? maps.map((_, h) => `head ${h}`) : [];
  return { labels, maps: shown, captions, n, vmax: maxOf(shown), title: titleOf(n) };
}

function titleOf(n) {
  const { model, view, layer, head } = state;
  const what = {
    head: `layer ${layer}, head ${head}`,
    grid: `layer ${layer}, all ${model.heads} heads`,
    mean: `layer ${layer}, mean of ${model.heads} heads`,
    rollout: `rollout through layers 0-${layer}`,
  }[view];
  const source = state.npy ? state.npy.name : "text";
  const cut = !state.npy && n === model.max_seq_len && $("truncate").checked ? " (the model's limit: longer text is cut)" : "";
  return `${model.id} · ${source} · ${n} tokens${cut} · ${what}`;
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
    if (state.shown?.labels.join("\u0000") !== shown.labels.join("\u0000")) state.selected = null;
    state.shown = shown;
    draw();
    status(shown.title, "ready");
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
  const attention = state.view === "head"
    ? { layers: [state.layer], heads: [state.head], reduce: "none" }
    : { layers: [state.layer], reduce: "mean" };
  if ($("norms").checked) attention.measure = "norms";
  status("asking the server…", "busy");
  try {
    const result = await explainRank(state.model.id, query, $("text").value, attention, $("truncate").checked);
    drawRank($("stage"), result, 0);
    $("stage").dataset.view = "rank";
    $("readout").textContent = "hover a line to read its weight";
    const what = state.view === "head" ? `layer ${state.layer}, head ${state.head}` : `layer ${state.layer}, head mean`;
    status(`${state.model.id} · query → document attention · ${what}`, "ready");
    $("download").disabled = true; // the PNG is of heatmaps
  } catch (error) {
    status(error.message, "error");
  }
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

function draw() {
  state.cursor = null;
  const stage = $("stage");
  stage.replaceChildren();
  stage.dataset.view = state.view;
  if (state.view === "grid") drawGrid(stage);
  else drawSingle(stage);
  readout(null);
}

/** Whole cells up to THUMBNAIL pixels; past that many tokens, averaged down to it. */
function thumbnailSize(n) {
  return n >= THUMBNAIL ? THUMBNAIL : n * Math.floor(THUMBNAIL / n);
}

function cellSize(n) {
  return Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(MAP_PIXELS / n)));
}

function drawSingle(stage) {
  const { labels, maps, n, vmax } = state.shown;
  const cell = cellSize(n);
  const scroller = element("div", "scroller");
  const map = element("div", "map");
  map.style.setProperty("--cell", `${cell}px`);
  map.style.setProperty("--n", n);
  const keys = element("div", "keys");
  const queries = element("div", "queries");
  labels.forEach((token, i) => {
    keys.append(tokenLabel(token, i, "key"));
    queries.append(tokenLabel(token, i, "query"));
  });
  const canvas = element("canvas");
  canvas.id = "heatmap";
  canvas.dataset.n = n;
  canvas.dataset.cell = cell;
  drawMap(canvas, maps[0], n, cell, vmax, state.selected);
  canvas.addEventListener("mousemove", (event) => hoverCell(event, canvas, cell));
  canvas.addEventListener("mouseleave", () => {
    $("tooltip").hidden = true;
    readout(state.cursor);
  });
  canvas.addEventListener("click", (event) => select(cellAt(event, canvas, cell)[0]));
  canvas.tabIndex = 0; // the keyboard's way in: arrows move over the cells, Enter selects
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", `${state.shown.title}: arrow keys read the cells, Enter highlights a token`);
  canvas.addEventListener("keydown", (event) => stepCell(event, n));
  canvas.addEventListener("blur", () => {
    state.cursor = null;
    redrawMap();
    readout(null);
  });
  map.append(element("div", "corner", "query ↓  key →"), keys, queries, canvas);
  scroller.append(map);
  stage.append(scroller, legend(Math.min(n * cell, 320), vmax));
  markSelected();
}

function drawGrid(stage) {
  const { maps, captions, n, vmax } = state.shown;
  const size = thumbnailSize(n);
  const grid = element("div", "grid");
  maps.forEach((map, h) => {
    const figure = element("figure", h === state.head ? "thumb chosen" : "thumb");
    const canvas = element("canvas");
    canvas.dataset.head = h;
    canvas.title = `layer ${state.layer}, head ${h}: click to enlarge`;
    drawThumbnail(canvas, map, n, size, vmax);
    figure.append(canvas, element("figcaption", "", captions[h]));
    figure.addEventListener("click", () => {
      state.head = h;
      state.view = "head";
      syncControls();
      show();
    });
    grid.append(figure);
  });
  stage.append(grid, legend(size, vmax));
}

function legend(height, vmax) {
  const box = element("div", "legend");
  const bar = element("canvas");
  drawScale(bar, height);
  box.append(element("span", "top", vmax.toFixed(3)), bar, element("span", "bottom", "0"));
  box.title = "attention weight (colour scale from 0 to the largest weight shown)";
  return box;
}

function tokenLabel(token, index, axis) {
  const label = element("span", "tok", token);
  label.dataset.index = index;
  label.title = `#${index} ${token} (${axis}): click to highlight`;
  label.addEventListener("click", () => select(index));
  return label;
}

function element(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

// ---------- hovering and selecting ----------

function cellAt(event, canvas, cell) {
  const box = canvas.getBoundingClientRect();
  const n = Number(canvas.dataset.n);
  const clamp = (v) => Math.max(0, Math.min(n - 1, Math.floor(v / cell)));
  return [clamp(event.clientY - box.top), clamp(event.clientX - box.left)];
}

function hoverCell(event, canvas, cell) {
  const [i, j] = cellAt(event, canvas, cell);
  readout({ i, j });
  const tip = $("tooltip");
  tip.hidden = false;
  tip.textContent = $("readout").textContent;
  tip.style.left = `${event.pageX + 14}px`;
  tip.style.top = `${event.pageY + 14}px`;
}

/** The readout line: a hovered cell, else the selected token, else a hint. */
function readout(cell) {
  const out = $("readout");
  const { labels, maps, n } = state.shown ?? {};
  delete out.dataset.query;
  delete out.dataset.key;
  delete out.dataset.weight;
  if (!cell) $("tooltip").hidden = true;
  if (!state.shown || state.view === "grid") {
    out.textContent = state.shown ? "click a head to enlarge it" : "";
    return;
  }
  const map = maps[0];
  if (cell) {
    const weight = map[cell.i * n + cell.j];
    Object.assign(out.dataset, { query: cell.i, key: cell.j, weight });
    out.textContent = `query “${labels[cell.i]}” (#${cell.i}) → key “${labels[cell.j]}” (#${cell.j}): ${weight.toFixed(4)}`;
    out.style.setProperty("--swatch", colourOf(weight, state.shown.vmax));
  } else if (state.selected !== null) {
    const t = state.selected;
    const row = [...Array(n).keys()].map((j) => map[t * n + j]);
    const column = [...Array(n).keys()].map((i) => map[i * n + t]);
    const top = (values) => values.indexOf(Math.max(...values));
    const [to, from] = [top(row), top(column)];
    out.textContent =
      `“${labels[t]}” (#${t}) attends most to “${labels[to]}” (${row[to].toFixed(3)}); ` +
      `attended most by “${labels[from]}” (${column[from].toFixed(3)})`;
  } else {
    out.textContent = "hover a cell to read its weight; click a token to highlight its row and column";
  }
}

function select(index) {
  state.selected = state.selected === index ? null : index;
  redrawMap();
  markSelected();
  readout(state.cursor);
}

function redrawMap() {
  const canvas = $("heatmap");
  if (!canvas) return;
  const { maps, n, vmax } = state.shown;
  drawMap(canvas, maps[0], n, Number(canvas.dataset.cell), vmax, state.selected, state.cursor);
}

const STEPS = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };

function stepCell(event, n) {
  const cursor = state.cursor ?? { i: 0, j: 0 };
  if (event.key === "Enter" || event.key === " ") {
    select(cursor.i);
  } else if (STEPS[event.key]) {
    const [di, dj] = state.cursor ? STEPS[event.key] : [0, 0]; // the first key lands on (0, 0)
    state.cursor = {
      i: Math.max(0, Math.min(n - 1, cursor.i + di)),
      j: Math.max(0, Math.min(n - 1, cursor.j + dj)),
    };
    redrawMap();
    readout(state.cursor);
  } else {
    return;
  }
  event.preventDefault(); // no page scroll under the arrows
}

function markSelected() {
  for (const label of document.querySelectorAll(".tok")) {
    label.classList.toggle("selected", Number(label.dataset.index) === state.selected);
  }
  $("stage").dataset.selected = state.selected ?? "";
}

// ---------- the URL: ?text=&model=&layer=&head=&view= ----------

function readUrl() {
  const params = new URLSearchParams(location.search);
  const named = state.models.find((m) => m.id === params.get("model"));
  setModel(named ?? state.models.find((m) => m.default) ?? state.models[0]);
  if (params.has("text")) $("text").value = params.get("text");
  state.layer = indexIn(params.get("layer"), state.model.layers);
  state.head = indexIn(params.get("head"), state.model.heads);
  state.view = VIEWS.includes(params.get("view")) ? params.get("view") : "head";
  $("norms").checked = params.get("measure") === "norms";
}

/** A layer or head index from the URL: negative counts from the end; anything else is 0. */
function indexIn(text, count) {
  const value = Number.parseInt(text ?? "0", 10);
  if (Number.isNaN(value) || value >= count || value < -count) return 0;
  return value < 0 ? count + value : value;
}

function writeUrl() {
  const params = new URLSearchParams();
  if (!state.npy) params.set("text", $("text").value); // an uploaded file cannot be linked
  params.set("model", state.model.id);
  params.set("layer", state.layer);
  params.set("head", state.head);
  params.set("view", state.view);
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
  const reranks = card.task === "rerank";
  $("query-row").hidden = !reranks;
  $("show-rank").hidden = !reranks;
  $("text").title = card.tokenizer ? "" : `${card.id} has no tokenizer: upload token embeddings`;
}

function syncControls() {
  $("model").value = state.model.id;
  $("layer").value = state.layer;
  $("head").value = state.head;
  $("head").disabled = state.view !== "head";
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
    cell: cellSize(n),
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
  readUrl();
  syncControls();
  show();
}

wire();
start();
