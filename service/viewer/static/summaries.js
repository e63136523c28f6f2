// The per-head summaries grid: layers down, heads across, each cell one head's summary
// (the mean over the sequence's query tokens), coloured on the grid's own scale. It costs
// one small answer ([L, H] numbers per summary, no maps), so it is the way into a long
// input: a click on a cell opens that layer's head.

import { colourOf, drawScale } from "./heatmap.js";

// The names /v1/encode takes (attention.summaries), in its order, with what each means.
export const SUMMARIES = {
  entropy: "entropy of each row (nats): low is focused, high is spread out",
  first: "attention to the first token ([CLS] / <s>)",
  self: "attention to the token itself",
  previous: "attention to the previous token",
  next: "attention to the next token",
  distance: "mean attended distance (tokens)",
};

/** The [L, H] grid of the ``name`` summary into ``stage``; ``pick(layer, head)`` on a click
 * (or Enter), ``hover(text)`` with a cell's reading. */
export function drawSummaries(stage, { summaries, name, chosen, pick, hover }) {
  const { shape, values } = summaries[name];
  const [layers, heads] = shape;
  let low = Infinity;
  let high = -Infinity;
  for (const v of values) {
    low = Math.min(low, v);
    high = Math.max(high, v);
  }
  const span = high > low ? high - low : 1;
  const table = document.createElement("table");
  table.id = "summaries";
  table.dataset.summary = name;
  const head = table.createTHead().insertRow();
  head.append(cell("th", "layer ↓ head →"));
  for (let h = 0; h < heads; h++) head.append(cell("th", String(h)));
  const body = table.createTBody();
  for (let l = 0; l < layers; l++) {
    const row = body.insertRow();
    row.append(cell("th", String(l)));
    for (let h = 0; h < heads; h++) {
      const value = values[l * heads + h];
      const button = document.createElement("button");
      button.type = "button";
      button.className = "sum";
      if (l === chosen.layer && h === chosen.head) button.classList.add("chosen");
      button.style.background = colourOf(value - low, span);
      button.style.color = (value - low) / span > 0.6 ? "#111" : "#fff"; // viridis turns light
      button.textContent = value.toFixed(2);
      Object.assign(button.dataset, { layer: l, head: h, value });
      const reading = `layer ${l}, head ${h}: ${name} ${value.toFixed(4)}`;
      button.title = `${reading} (click to see its map)`;
      button.addEventListener("click", () => pick(l, h));
      button.addEventListener("mouseenter", () => hover(reading, button.dataset));
      button.addEventListener("focus", () => hover(reading, button.dataset));
      const td = document.createElement("td");
      td.append(button);
      row.append(td);
    }
  }
  stage.replaceChildren(table, legend(low, high, Math.min(240, 30 * layers), SUMMARIES[name]));
}

function cell(tag, text) {
  const node = document.createElement(tag);
  node.textContent = text;
  return node;
}

function legend(low, high, height, meaning) {
  const box = document.createElement("div");
  box.className = "legend";
  box.title = `${meaning} (colour scale from the grid's smallest to its largest value)`;
  const bar = document.createElement("canvas");
  drawScale(bar, height);
  box.append(cell("span", high.toFixed(3)), bar, cell("span", low.toFixed(3)));
  return box;
}
