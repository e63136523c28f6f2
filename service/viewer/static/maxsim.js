// "Why it ranked" on a multi-vector (late-interaction) model: the MaxSim score split.
//
// /v1/rerank's explanation names, per query token with a vector, the document token its
// vector matched best and that match's term; the terms sum to the score exactly. Query
// tokens on the left, document tokens on the right, a line from each query token to its
// best document token (thicker and more opaque the larger its share of the score; red
// where the term is negative), each document token shaded by the terms it took.

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

function percent(share) {
  return `${(100 * share).toFixed(1)}%`;
}

/** One reranked result of a multi-vector model (its MaxSim explanation) into ``stage``. */
export function drawMaxSim(stage, result) {
  const { query_tokens: query, document_tokens: document_, matches } = result.explanation;
  const score = result.relevance_score;
  let sum = 0;
  for (const match of matches) sum += match.score;
  const height = ROW * (Math.max(query.length, document_.length) + 1);
  const drawing = svg("svg", { id: "maxsim", width: WIDTH, height, role: "img" });
  drawing.setAttribute("aria-label", `MaxSim: each of ${query.length} query tokens joined to its best of ${document_.length} document tokens`);
  const x1 = TOKEN_BOX + 10;
  const x2 = WIDTH - TOKEN_BOX - 10;
  const y = (k) => ROW * (k + 1);
  let strongest = 0;
  for (const match of matches) strongest = Math.max(strongest, Math.abs(match.score));
  strongest = strongest > 0 ? strongest : 1;
  // Weakest first, so the strongest lines are drawn on top.
  const order = [...matches].sort((a, b) => Math.abs(a.score) - Math.abs(b.score));
  for (const match of order) {
    const weight = Math.abs(match.score) / strongest;
    const share = score !== 0 ? match.score / score : 0;
    const line = svg("line", {
      x1, y1: y(match.query_index), x2, y2: y(match.document_index),
      stroke: `rgb(${(match.score >= 0 ? FOR : AGAINST).join(", ")})`,
      "stroke-width": (0.75 + 3 * weight).toFixed(2),
      "stroke-opacity": (0.3 + 0.7 * weight).toFixed(2),
      class: "match",
    });
    Object.assign(line.dataset, {
      query: match.query_index, document: match.document_index, term: match.score, share,
    });
    line.append(svg("title", {}, `${query[match.query_index]} → ${document_[match.document_index]}: ` +
      `${match.score.toFixed(5)} (${percent(share)} of the score)`));
    drawing.append(line);
  }
  // A document token's total: the terms of the query tokens that matched it best.
  const taken = new Array(document_.length).fill(0);
  for (const match of matches) taken[match.document_index] += match.score;
  const termOf = new Array(query.length).fill(null);
  for (const match of matches) termOf[match.query_index] = match.score;
  const column = (tokens, totals, side) => {
    let top = 0;
    for (const v of totals) top = Math.max(top, Math.abs(v ?? 0));
    top = top > 0 ? top : 1;
    tokens.forEach((token, k) => {
      const total = totals[k] ?? 0;
      const x = side === "left" ? 0 : WIDTH - TOKEN_BOX;
      const box = svg("rect", { x, y: y(k) - ROW / 2 + 1, width: TOKEN_BOX, height: ROW - 2, rx: 3, fill: tint(total, top) });
      const text = svg("text", {
        x: side === "left" ? TOKEN_BOX - 6 : WIDTH - TOKEN_BOX + 6, y: y(k),
        "text-anchor": side === "left" ? "end" : "start",
        class: side === "left" ? "qtok" : "dtok",
        fill: Math.abs(total) / top > 0.55 ? "#fff" : "#111", // legible on a dark box
      }, token);
      text.dataset.index = k;
      text.dataset.total = total;
      const title = svg("title", {}, `#${k} ${token}: ${total.toFixed(5)} of the score`);
      const group = svg("g", {});
      group.append(title, box, text);
      drawing.append(group);
    });
  };
  column(query, termOf, "left");
  column(document_, taken, "right");

  const side = document.createElement("div");
  side.className = "match-side";
  const shown = document.createElement("p");
  shown.id = "maxsim-score";
  shown.dataset.score = score;
  shown.dataset.sum = sum;
  shown.textContent = `MaxSim score ${score.toFixed(4)} = the sum of ${matches.length} terms (${sum.toFixed(4)})`;
  const note = document.createElement("p");
  note.textContent =
    "each query token's best document token and that match's term, largest first; " +
    "its share is term / score";
  const list = document.createElement("ol");
  list.id = "maxsim-matches";
  for (const match of [...matches].sort((a, b) => b.score - a.score || a.query_index - b.query_index)) {
    const item = document.createElement("li");
    const share = score !== 0 ? match.score / score : 0;
    item.textContent = `${query[match.query_index]} → ${document_[match.document_index]} ` +
      `${match.score.toFixed(5)} (${percent(share)})`;
    Object.assign(item.dataset, { query: match.query_index, document: match.document_index, term: match.score });
    list.append(item);
  }
  side.append(shown, note, list);
  stage.replaceChildren(drawing, side);
}
