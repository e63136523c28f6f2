// The viewer's state, its URL, its controls and the drawing of the current view.
//
// One-way flow: controls and the URL set `state`; show() asks the server for exactly the
// maps the view needs (cached per input), then draw() renders them. The summaries view
// asks for no maps at all, only per-head numbers: the way into a long input.

import {
  apiKey, countTokens, embedSparse, encodeAttention, encodeSummaries, explainRank,
  explainSimilarity, listModels, setApiKey,
} from "./api.js";
import { colourOf, drawMap, drawScale, drawThumbnail, maxOf, spreadTopK, viewImage } from "./heatmap.js";
import { drawMatch } from "./match.js";
import { parseNpy } from "./npy.js";
import { drawRank } from "./rank.js";
import { SUMMARIES, drawSummaries } from "./summaries.js";

const VIEWS = ["summaries", "head", "grid", "mean", "rollout"];
const MAP_PIXELS = 640; // a map wider than this scrolls, its labels kept in view
const MIN_CELL = 12; // the smallest cell whose token label stays readable
const MAX_CELL = 28;
const ZOOMS = [1, 2, 3, 4, 6, 8, 12, 16, 20, 28]; // cell sizes the zoom steps through
const LABEL_PIXELS = 12; // below this cell size only every few token labels are written
const LONG = 256; // "auto": past this many tokens a map keeps only each row's top AUTO_K
const AUTO_K = 32;
const TOP_PAIRS = 20; // the match view's lines
const THUMBNAIL = 160; // grid thumbnails: whole cells up to this size, averaged beyond
const CACHE_SIZE = 16;

const $ = (id) => document.getElementById(id);
const state = {
  models: [],
  model: null, // the chosen model's card from /v1/models
  layer: 0,
  head: 0,
  view: "summaries",
  summary: "entropy", // the summary the grid is coloured by
  topk: "auto", // keys kept per query row: "auto", "all" or a number
  cell: null, // the zoom: pixels per cell, or null for the size that fits the tokens
  npy: null, // {name, shape, values} when token embeddings were uploaded
  selected: null, // the clicked token, highlighted in the single-map views
  cursor: null, // the cell the keyboard is on: {i, j}
  shown: null, // what draw() renders: {labels, maps, captions, n, vmax, title}
};
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
  const key = JSON.stringify([state.model.id, inputKey(), $("truncate").checked]);
  if (!counts.has(key)) {
    const count = countTokens(state.model.id, $("text").value, $("truncate").checked);
    count.catch(() => counts.delete(key));
    counts.set(key, count);
  }
  return counts.get(key);
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
    draw();
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
    $("zoom").hidden = true;
    $("readout").textContent = "hover a line or a token to read its share of the score";
    status(`${state.model.id} · text → second text: the cosine split into token pairs (mean pooling)`, "ready");
    $("download").disabled = true; // the PNG is of heatmaps
  } catch (error) {
    if (mine === asked) status(error.message, "error");
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
  if (state.view === "summaries") drawSummaryGrid(stage);
  else if (state.view === "grid") drawGrid(stage);
  else drawSingle(stage);
  $("zoom").hidden = state.view === "summaries" || state.view === "grid";
  readout(null);
}

function drawSummaryGrid(stage) {
  drawSummaries(stage, {
    summaries: state.shown.summaries,
    name: state.summary,
    chosen: { layer: state.layer, head: state.head },
    pick: (layer, head) => {
      Object.assign(state, { layer, head, view: "head" });
      syncControls();
      show();
    },
    hover: (text, { layer, head, value }) => {
      $("readout").textContent = text;
      Object.assign($("readout").dataset, { layer, head, value });
    },
  });
}

/** Whole cells up to THUMBNAIL pixels; past that many tokens, averaged down to it. */
function thumbnailSize(n) {
  return n >= THUMBNAIL ? THUMBNAIL : n * Math.floor(THUMBNAIL / n);
}

function cellSize(n) {
  return Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(MAP_PIXELS / n)));
}

function drawSingle(stage) {
  const { labels, maps, n, vmax, topk } = state.shown;
  const cell = state.cell ?? cellSize(n);
  // Small cells: every step-th label written (the rest kept, empty, to click and hover).
  const step = cell >= LABEL_PIXELS ? 1 : Math.ceil(LABEL_PIXELS / cell);
  const scroller = element("div", "scroller");
  const map = element("div", step > 1 ? "map thinned" : "map");
  map.style.setProperty("--cell", `${cell}px`);
  map.style.setProperty("--n", n);
  const keys = element("div", "keys");
  const queries = element("div", "queries");
  labels.forEach((token, i) => {
    keys.append(tokenLabel(token, i, "key", i % step === 0));
    queries.append(tokenLabel(token, i, "query", i % step === 0));
  });
  const canvas = element("canvas");
  canvas.id = "heatmap";
  canvas.dataset.n = n;
  canvas.dataset.cell = cell;
  canvas.dataset.topk = topk ?? "";
  scroller.addEventListener("wheel", (event) => {
    if (!event.ctrlKey) return; // a plain wheel scrolls; with Ctrl it zooms
    event.preventDefault();
    zoom(event.deltaY < 0 ? 1 : -1, event);
  }, { passive: false });
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

function tokenLabel(token, index, axis, written = true) {
  const label = element("span", "tok", written ? token : "");
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
  for (const name of ["query", "key", "weight", "layer", "head", "value"]) delete out.dataset[name];
  if (!cell) $("tooltip").hidden = true;
  if (!state.shown || state.view === "grid" || state.view === "summaries") {
    const hint = state.view === "grid" ? "click a head to enlarge it" : "click a cell to see that layer's head";
    out.textContent = state.shown ? hint : "";
    return;
  }
  const map = maps[0];
  if (cell) {
    const weight = map[cell.i * n + cell.j];
    const pair = `query “${labels[cell.i]}” (#${cell.i}) → key “${labels[cell.j]}” (#${cell.j})`;
    if (Number.isNaN(weight)) { // a top-k map's cell that was not kept
      Object.assign(out.dataset, { query: cell.i, key: cell.j, weight: "" });
      out.textContent = `${pair}: not among the row's top ${state.shown.topk}`;
      out.style.setProperty("--swatch", "transparent");
      return;
    }
    Object.assign(out.dataset, { query: cell.i, key: cell.j, weight });
    out.textContent = `${pair}: ${weight.toFixed(4)}`;
    out.style.setProperty("--swatch", colourOf(weight, state.shown.vmax));
  } else if (state.selected !== null) {
    const t = state.selected;
    const row = [...Array(n).keys()].map((j) => map[t * n + j]);
    const column = [...Array(n).keys()].map((i) => map[i * n + t]);
    const top = (values) => values.reduce((best, v, k) => (v > (values[best] ?? -Infinity) ? k : best), 0);
    const [to, from] = [top(row), top(column)];
    const read = (v) => (Number.isNaN(v) ? "not kept" : v.toFixed(3));
    out.textContent =
      `“${labels[t]}” (#${t}) attends most to “${labels[to]}” (${read(row[to])}); ` +
      `attended most by “${labels[from]}” (${read(column[from])})`;
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

// ---------- zooming a map ----------

/** One zoom step in (1) or out (-1), or "fit" the whole map in view; with a pointer
 * (Ctrl + wheel) the point under it stays under it. */
function zoom(direction, pointer = null) {
  if (!state.shown || state.view === "summaries" || state.view === "grid") return;
  const { n } = state.shown;
  const current = state.cell ?? cellSize(n);
  let next;
  if (direction === "fit") {
    const scroller = document.querySelector(".scroller");
    const width = scroller.clientWidth - document.querySelector(".queries").offsetWidth;
    const height = window.innerHeight * 0.78 - document.querySelector(".keys").offsetHeight;
    next = [...ZOOMS].reverse().find((c) => c * n <= Math.min(width, height)) ?? ZOOMS[0];
  } else if (direction > 0) {
    next = ZOOMS.find((c) => c > current) ?? current;
  } else {
    next = [...ZOOMS].reverse().find((c) => c < current) ?? current;
  }
  if (next === current) return;
  let anchor = null; // the pointer's place on the map, in cells, and in the scroller
  if (pointer) {
    const box = $("heatmap").getBoundingClientRect();
    const view = document.querySelector(".scroller").getBoundingClientRect();
    anchor = {
      x: (pointer.clientX - box.left) / current, y: (pointer.clientY - box.top) / current,
      left: pointer.clientX - view.left, top: pointer.clientY - view.top,
    };
  }
  state.cell = next;
  draw();
  if (anchor) {
    const scroller = document.querySelector(".scroller");
    const canvas = $("heatmap");
    scroller.scrollLeft = canvas.offsetLeft + anchor.x * next - anchor.left;
    scroller.scrollTop = canvas.offsetTop + anchor.y * next - anchor.top;
  }
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
  state.summary = params.get("summary") in SUMMARIES ? params.get("summary") : "entropy";
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
  const reranks = card.task === "rerank";
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
  $("summary").addEventListener("change", () => {
    state.summary = $("summary").value;
    writeUrl();
    if (state.view === "summaries" && state.shown?.summaries) draw(); // already here: no request
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
