// "Why it ranked": a reranker's query and document side by side, joined by attention.
//
// Query tokens on the left, document tokens on the right; a line from query token i to
// document token j for each of the strongest pairs of the chosen layer's attention
// (head mean, or one head), its width and opacity its weight. Beside it, the document
// tokens the query attends to most, as /v1/rerank ranks them.

import { colourOf } from "./heatmap.js";

// SVG's namespace, as the HTML parser gives it (so no URL is spelled out here).
const SVG = (() => {
  const template = document.createElement("template");
  template.innerHTML = "<svg></svg>";
  return template.content.firstChild.namespaceURI;
})();
const ROW = 20; // pixels per token row
const WIDTH = 560;
const MAX_LINES = 60; // the strongest pairs drawn; the rest would only be haze

/** The q x d map of one explanation: [L', H', q, d] nested lists, layer 0 and ``head``
 * (or the mean of the heads when there is one map per layer). */
export function pairMap(explanation, head) {
  const maps = explanation.attention[0];
  return maps.length === 1 ? maps[0] : maps[head];
}

/** The strongest (i, j, weight) pairs of a q x d map, largest first. */
export function strongestPairs(map, count = MAX_LINES) {
  const pairs = [];
  map.forEach((row, i) => row.forEach((weight, j) => pairs.push([i, j, weight])));
  pairs.sort((a, b) => b[2] - a[2] || a[0] - b[0] || a[1] - b[1]);
  return pairs.slice(0, count);
}

function svg(tag, attributes, text = "") {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

/** The bipartite drawing of one explained result into ``stage``. */
export function drawRank(stage, result, head) {
  const { query_tokens: query, document_tokens: document_, top_tokens: top } = result.explanation;
  const map = pairMap(result.explanation, head);
  const pairs = strongestPairs(map);
  const vmax = pairs.length ? pairs[0][2] : 1;
  const height = ROW * (Math.max(query.length, document_.length) + 1);
  const drawing = svg("svg", { id: "rank", width: WIDTH, height, role: "img" });
  drawing.setAttribute("aria-label", `attention from ${query.length} query tokens to ${document_.length} document tokens`);
  const left = 150;
  const right = WIDTH - 150;
  const y = (k) => ROW * (k + 1);
  for (const [i, j, weight] of pairs) {
    const line = svg("line", {
      x1: left, y1: y(i), x2: right, y2: y(j),
      stroke: colourOf(weight, vmax),
      "stroke-width": (0.5 + (3.5 * weight) / vmax).toFixed(2),
      "stroke-opacity": (0.25 + (0.75 * weight) / vmax).toFixed(2),
      class: "pair",
    });
    line.dataset.query = i;
    line.dataset.document = j;
    line.dataset.weight = weight;
    line.append(svg("title", {}, `${query[i]} → ${document_[j]}: ${weight.toFixed(4)}`));
    drawing.append(line);
  }
  query.forEach((token, i) => drawing.append(svg("text", { x: left - 6, y: y(i), "text-anchor": "end", class: "qtok" }, token)));
  document_.forEach((token, j) => drawing.append(svg("text", { x: right + 6, y: y(j), class: "dtok" }, token)));
  const list = document.createElement("ol");
  list.id = "rank-top";
  for (const { index, token, weight } of top) {
    const item = document.createElement("li");
    item.textContent = `${token} (#${index}) ${weight.toFixed(4)}`;
    item.dataset.index = index;
    item.dataset.weight = weight;
    list.append(item);
  }
  const side = document.createElement("div");
  side.className = "rank-side";
  const score = document.createElement("p");
  score.id = "rank-score";
  score.textContent = `relevance score ${result.relevance_score.toFixed(4)}`;
  score.dataset.score = result.relevance_score;
  const heading = document.createElement("h2");
  heading.textContent = "document tokens the query attends to most";
  side.append(score, heading, list);
  stage.replaceChildren(drawing, side);
}
