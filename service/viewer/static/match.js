// "Why they match": two texts side by side, joined by what their tokens add to the score.
//
// For a mean-pooled model the served cosine is exactly the sum of token-pair terms
// a_i·b_j / (n_a n_b ‖ā‖ ‖b̄‖) (POST /v1/explain/similarity). The first text's tokens on
// the left, the second's on the right, a line for each of the top pairs (thicker and more
// opaque the larger its share; red where it counts against the match), and each token
// shaded by its total: the sum of its row (or column) of pair terms.

const SVG = (() => {
  const template = document.createElement("template");
  template.innerHTML = "<svg></svg>";
  return template.content.firstChild.namespaceURI;
})();
const ROW = 20; // pixels per token row
const WIDTH = 600;
const TOKEN_BOX = 140; // the shaded box behind a token
const FOR = [59, 82, 139]; // a term that adds to the score (viridis' blue)
const AGAINST = [214, 39, 40]; // one that takes from it

function svg(tag, attributes, text = "") {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

function tint(value, top) {
  const [r, g, b] = value >= 0 ? FOR : AGAINST;
  return `rgba(${r}, ${g}, ${b}, ${(Math.abs(value) / top).toFixed(3)})`;
}

function largestMagnitude(values) {
  let top = 0;
  for (const v of values) top = Math.max(top, Math.abs(v));
  return top > 0 ? top : 1;
}

/** One explained pair (an item of /v1/explain/similarity's data) into ``stage``. */
export function drawMatch(stage, result) {
  const { query_tokens: left, document_tokens: right, top_pairs: pairs } = result;
  const height = ROW * (Math.max(left.length, right.length) + 1);
  const drawing = svg("svg", { id: "match", width: WIDTH, height, role: "img" });
  drawing.setAttribute("aria-label", `token pairs of two texts (${left.length} and ${right.length} tokens) by their share of the score`);
  const x1 = TOKEN_BOX + 10;
  const x2 = WIDTH - TOKEN_BOX - 10;
  const y = (k) => ROW * (k + 1);
  const strongest = largestMagnitude(pairs.map((p) => p.contribution));
  // Weakest first, so the strongest lines are drawn on top.
  for (const pair of [...pairs].reverse()) {
    const share = Math.abs(pair.contribution) / strongest;
    const line = svg("line", {
      x1, y1: y(pair.query_index), x2, y2: y(pair.document_index),
      stroke: `rgb(${(pair.contribution >= 0 ? FOR : AGAINST).join(", ")})`,
      "stroke-width": (0.75 + 4 * share).toFixed(2),
      "stroke-opacity": (0.2 + 0.8 * share).toFixed(2),
      class: "pair",
    });
    Object.assign(line.dataset, {
      query: pair.query_index, document: pair.document_index, contribution: pair.contribution,
    });
    line.append(svg("title", {}, `${pair.query_token} ↔ ${pair.document_token}: ${pair.contribution.toFixed(5)}`));
    drawing.append(line);
  }
  const column = (tokens, totals, side) => {
    const top = largestMagnitude(totals);
    tokens.forEach((token, k) => {
      const x = side === "left" ? 0 : WIDTH - TOKEN_BOX;
      const box = svg("rect", { x, y: y(k) - ROW / 2 + 1, width: TOKEN_BOX, height: ROW - 2, rx: 3, fill: tint(totals[k], top) });
      const text = svg("text", {
        x: side === "left" ? TOKEN_BOX - 6 : WIDTH - TOKEN_BOX + 6, y: y(k),
        "text-anchor": side === "left" ? "end" : "start",
        class: side === "left" ? "qtok" : "dtok",
        fill: Math.abs(totals[k]) / top > 0.55 ? "#fff" : "#111", // legible on a dark box
      }, token);
      text.dataset.index = k;
      text.dataset.total = totals[k];
      const title = svg("title", {}, `#${k} ${token}: ${totals[k].toFixed(5)} of the score`);
      const group = svg("g", {});
      group.append(title, box, text);
      drawing.append(group);
    });
  };
  column(left, result.query_totals, "left");
  column(right, result.document_totals, "right");

  const side = document.createElement("div");
  side.className = "match-side";
  const score = document.createElement("p");
  score.id = "match-score";
  score.dataset.score = result.score;
  score.textContent = `cosine similarity ${result.score.toFixed(4)}`;
  const note = document.createElement("p");
  note.textContent =
    `the sum of all ${left.length} × ${right.length} token-pair terms; ` +
    `lines: the ${pairs.length} largest, blue adds to the score, red takes from it`;
  const list = document.createElement("ol");
  list.id = "match-top";
  for (const pair of pairs) {
    const item = document.createElement("li");
    item.textContent = `${pair.query_token} ↔ ${pair.document_token} ${pair.contribution.toFixed(5)}`;
    list.append(item);
  }
  side.append(score, note, list);
  stage.replaceChildren(drawing, side);
}
