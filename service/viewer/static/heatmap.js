// Drawing attention maps: a colour scale, heatmaps, thumbnails and the PNG of a view.

// viridis (matplotlib, CC0): perceptually uniform and readable in greyscale.
const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
const LUT = buildLut(VIRIDIS, 256);
const FADE = 0.7; // how far cells outside a selected token's row and column fade to white
// A top-k map's cells that were not kept (NaN in the map): painted as the page, not as 0.
export const EMPTY = [246, 246, 248];

function buildLut(stops, size) {
  const rgb = stops.map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));
  const lut = new Uint8ClampedArray(size * 3);
  for (let k = 0; k < size; k++) {
    const t = (k / (size - 1)) * (rgb.length - 1);
    const low = Math.min(Math.floor(t), rgb.length - 2);
    const f = t - low;
    for (let c = 0; c < 3; c++) lut[k * 3 + c] = rgb[low][c] * (1 - f) + rgb[low + 1][c] * f;
  }
  return lut;
}

/** The CSS colour of a weight on a scale from 0 to vmax. */
export function colourOf(weight, vmax) {
  const k = lutIndex(weight, vmax) * 3;
  return `rgb(${LUT[k]}, ${LUT[k + 1]}, ${LUT[k + 2]})`;
}

function lutIndex(weight, vmax) {
  return Math.max(0, Math.min(255, Math.round((weight / vmax) * 255)));
}

/**
 * Top-k maps ([heads, n, k] weights and key indices) spread to [n * n] maps per head, the
 * cells not kept NaN: drawn as empty, read as "not kept". Index -1 pads a short row.
 */
export function spreadTopK(values, indices, heads, n, k) {
  return [...Array(heads).keys()].map((h) => {
    const map = new Float32Array(n * n).fill(NaN);
    for (let i = 0; i < n; i++) {
      for (let r = 0; r < k; r++) {
        const at = (h * n + i) * k + r;
        if (indices[at] >= 0) map[i * n + indices[at]] = values[at];
      }
    }
    return map;
  });
}

/** The largest value of some maps: the top of their shared colour scale. */
export function maxOf(maps) {
  let top = 0;
  for (const map of maps) for (const v of map) if (v > top) top = v;
  return top > 0 ? top : 1;
}

// One pixel per cell; the caller scales it up (crisp) or down (averaged).
function matrixImage(map, n, vmax, selected) {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = n;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(n, n);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      const weight = map[i * n + j];
      const k = lutIndex(weight, vmax) * 3;
      const p = (i * n + j) * 4;
      const fade = selected !== null && i !== selected && j !== selected ? FADE : 0;
      for (let c = 0; c < 3; c++) {
        image.data[p + c] = Number.isNaN(weight) ? EMPTY[c] : LUT[k + c] + (255 - LUT[k + c]) * fade;
      }
      image.data[p + 3] = 255;
    }
  }
  ctx.putImageData(image, 0, 0);
  return canvas;
}

/**
 * A map [n, n] at ``cell`` pixels per cell, the selected token's row and column outlined,
 * and the keyboard's cell ({i, j}) framed.
 */
export function drawMap(canvas, map, n, cell, vmax, selected = null, cursor = null) {
  canvas.width = canvas.height = n * cell;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(matrixImage(map, n, vmax, selected), 0, 0, n * cell, n * cell);
  if (selected !== null) {
    ctx.strokeStyle = "#d62728";
    ctx.lineWidth = 2;
    ctx.strokeRect(1, selected * cell + 1, n * cell - 2, cell - 2); // what it attends to
    ctx.strokeRect(selected * cell + 1, 1, cell - 2, n * cell - 2); // what attends to it
  }
  if (cursor !== null) {
    ctx.strokeStyle = "#fff";
    ctx.lineWidth = 2;
    ctx.strokeRect(cursor.j * cell + 1, cursor.i * cell + 1, cell - 2, cell - 2);
  }
}

/** A thumbnail of ``size`` pixels: whole cells when they fit, else averaged down. */
export function drawThumbnail(canvas, map, n, size, vmax) {
  canvas.width = canvas.height = size;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = n > size;
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(matrixImage(map, n, vmax, null), 0, 0, size, size);
}

/** A vertical colour bar, vmax at the top. */
export function drawScale(canvas, height) {
  canvas.width = 14;
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  for (let y = 0; y < height; y++) {
    ctx.fillStyle = colourOf(1 - y / Math.max(1, height - 1), 1);
    ctx.fillRect(0, y, 14, 1);
  }
}

const FONT = "12px system-ui, sans-serif";
const PAD = 16;

function labelWidth(ctx, labels) {
  return Math.ceil(Math.max(0, ...labels.map((t) => ctx.measureText(t).width))) + 6;
}

/**
 * The current view as one PNG-ready canvas: title, token labels on both axes (for one
 * map) or head captions (for the grid), and the colour scale with its range.
 */
export function viewImage({ title, labels, maps, captions, vmax, selected, cell, thumbnail }) {
  const canvas = document.createElement("canvas");
  const ctx = canvas.getContext("2d");
  ctx.font = FONT;
  const n = labels.length;
  const grid = maps.length > 1;
  const margin = grid ? 0 : labelWidth(ctx, labels);
  const columns = grid ? Math.min(4, maps.length) : 1;
  const rows = Math.ceil(maps.length / columns);
  const tile = grid ? thumbnail : n * cell;
  const captionHeight = grid ? 18 : 0;
  const bodyWidth = margin + columns * (tile + PAD);
  const bodyHeight = margin + rows * (tile + captionHeight + PAD);
  canvas.width = PAD + bodyWidth + 70;
  canvas.height = PAD + 24 + bodyHeight;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.font = FONT;
  ctx.fillStyle = "#111";
  ctx.textBaseline = "top";
  ctx.fillText(title, PAD, PAD);
  const top = PAD + 24 + margin;
  const left = PAD + margin;
  maps.forEach((map, index) => {
    const x = left + (index % columns) * (tile + PAD);
    const y = top + Math.floor(index / columns) * (tile + captionHeight + PAD);
    const tileCanvas = document.createElement("canvas");
    if (grid) drawThumbnail(tileCanvas, map, n, tile, vmax);
    else drawMap(tileCanvas, map, n, cell, vmax, selected);
    ctx.drawImage(tileCanvas, x, y);
    if (grid) {
      ctx.fillStyle = "#111";
      ctx.fillText(captions[index], x, y + tile + 3);
    }
  });
  if (!grid) {
    ctx.fillStyle = "#111";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    labels.forEach((t, i) => ctx.fillText(t, left - 4, top + i * cell + cell / 2)); // queries
    ctx.save();
    ctx.translate(left, top - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    labels.forEach((t, j) => ctx.fillText(t, 0, j * cell + cell / 2)); // keys, read upwards
    ctx.restore();
  }
  const scale = document.createElement("canvas");
  const scaleHeight = Math.min(tile, 240);
  drawScale(scale, scaleHeight);
  const scaleX = PAD + bodyWidth;
  ctx.drawImage(scale, scaleX, top);
  ctx.fillStyle = "#111";
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  ctx.fillText(vmax.toFixed(3), scaleX + 18, top);
  ctx.textBaseline = "bottom";
  ctx.fillText("0", scaleX + 18, top + scaleHeight);
  return canvas;
}
