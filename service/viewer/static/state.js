// The page's state, shared by its modules: what is chosen and what is shown.

export const $ = (id) => document.getElementById(id);

export function element(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

export const state = {
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
