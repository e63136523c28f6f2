// Drawing the current view into the page and reading it: the summaries grid, one map
// (scrolling, zooming, its labels thinned when cells get small), the heads of a layer;
// hovering, the keyboard, and the highlighted token.

import { colourOf, drawMap, drawScale, drawThumbnail } from "./heatmap.js";
import { $, element, state } from "./state.js";
import { drawSummaries } from "./summaries.js";

const MAP_PIXELS = 640; // a map wider than this scrolls, its labels kept in view
const MIN_CELL = 12; // the smallest cell whose token label stays readable
const MAX_CELL = 28;
const LONG_MAP = 256; // past this many tokens a map starts at LONG_CELL, its labels thinned
const LONG_CELL = 4;
const ZOOMS = [1, 2, 3, 4, 6, 8, 12, 16, 20, 28]; // cell sizes the zoom steps through
const LABEL_PIXELS = 12; // below this cell size only every few token labels are written
const THUMBNAIL = 160; // grid thumbnails: whole cells up to this size, averaged beyond

let opener = () => {}; // draw()'s ``open``

/** The current view (state.shown) into the stage; ``open(layer, head)`` is what a click on
 * a summaries cell or a grid thumbnail does: show that layer's head. */
export function draw(open = opener) {
  opener = open;
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
    pick: (layer, head) => opener(layer, head),
    hover: (text, { layer, head, value }) => {
      $("readout").textContent = text;
      Object.assign($("readout").dataset, { layer, head, value });
    },
  });
}

/** Whole cells up to THUMBNAIL pixels; past that many tokens, averaged down to it. */
export function thumbnailSize(n) {
  return n >= THUMBNAIL ? THUMBNAIL : n * Math.floor(THUMBNAIL / n);
}

/** The cell size before any zoom: labels readable up to LONG_MAP tokens; past that a
 * map a couple of screens wide (at 12 px a 512-token map would be 6144 px square). */
export function cellSize(n) {
  if (n > LONG_MAP) return LONG_CELL;
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
    figure.addEventListener("click", () => opener(state.layer, h));
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
export function readout(cell) {
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

export function select(index) {
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
export function zoom(direction, pointer = null) {
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
