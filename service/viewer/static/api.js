// The page's only contact with the server: the public API, as any client uses it.
// URLs are relative to /viewer, so a path prefix in front of the server still works.

const KEY_STORAGE = "attnserve.apiKey";

export class ApiError extends Error {
  constructor(status, message, type) {
    super(`${status}${type ? ` ${type}` : ""}: ${message}`);
    this.status = status;
  }
}

/** The API key, kept for this tab only (sessionStorage) and sent as a Bearer token. */
export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) ?? "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

async function call(path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const payload = await response.json().catch(() => null);
  if (!response.ok) {
    throw new ApiError(response.status, payload?.error ?? response.statusText, payload?.error_type);
  }
  return payload;
}

export async function listModels() {
  return (await call("v1/models")).data;
}

/** One sequence's attention maps, as asked: [layers', heads', n, n] and the tokens (or null).
 * With ``attention.top_k`` the maps are the kept weights [layers', heads', n, k] and
 * ``indices`` their key indices (same shape); otherwise ``indices`` is null. */
export async function encodeAttention(model, input, attention, truncate) {
  const item = await encodeOne(model, input, attention, truncate);
  return {
    tokens: item.tokens,
    shape: item.attention.shape,
    values: decode(item.attention),
    indices: item.attention_indices ? decode(item.attention_indices) : null,
  };
}

/** Per-head summaries of every layer and head, no maps: {name: {shape [L, H], values}}. */
export async function encodeSummaries(model, input, names, truncate) {
  const item = await encodeOne(model, input, { summaries: names, maps: false }, truncate);
  const summaries = {};
  for (const [name, array] of Object.entries(item.attention_summaries)) {
    summaries[name] = { shape: array.shape, values: decode(array) };
  }
  return { tokens: item.tokens, summaries };
}

async function encodeOne(model, input, attention, truncate) {
  const body = {
    model,
    inputs: [typeof input === "string" ? input : toBase64Array(input)],
    return_embeddings: false,
    return_attention: true,
    attention,
    encoding_format: "base64",
    truncate,
  };
  return (await call("v1/encode", body)).data[0];
}

/** How many tokens a text is (after the model's tokenizer, cut to its limit if asked). */
export async function countTokens(model, text, truncate) {
  return (await call("v1/tokenize", { model, text, truncate })).data[0].tokens.length;
}

/** Why a text and another matched: /v1/explain/similarity's answer for the one pair
 * (score, both token lists, the top pairs and per-token totals). */
export async function explainSimilarity(model, query, document, topPairs, truncate) {
  const body = { model, query, documents: [document], top_pairs: topPairs, truncate };
  return (await call("v1/explain/similarity", body)).data[0];
}

/** One document reranked against a query, with the attention from the query's tokens to
 * the document's (the chosen maps) and its most attended tokens. */
export async function explainRank(model, query, document, attention, truncate) {
  const body = {
    model,
    query,
    documents: [document],
    return_attention: true,
    attention,
    top_tokens: 8,
    truncate,
  };
  return (await call("v1/rerank", body)).results[0];
}

/** One document reranked against a query by a multi-vector model, with its MaxSim
 * explanation: per query token its best document token and that match's term. */
export async function explainMaxSim(model, query, document, truncate) {
  const body = { model, query, documents: [document], return_attention: true, truncate };
  return (await call("v1/rerank", body)).results[0];
}

/** A text's BM42 sparse vector with the stem behind each index. */
export async function embedSparse(model, text, truncate) {
  const body = { model, inputs: [text], return_text: true, truncate };
  return (await call("v1/embed_sparse", body)).data[0];
}

// Base64Array: standard base64 of little-endian values of its dtype: float32, or int32
// (top-k key indices). DataView keeps it right on any host.
function decode({ data, dtype }) {
  const binary = atob(data);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  const view = new DataView(bytes.buffer);
  if (dtype === "int32") {
    const values = new Int32Array(bytes.length / 4);
    for (let i = 0; i < values.length; i++) values[i] = view.getInt32(i * 4, true);
    return values;
  }
  if (dtype && dtype !== "float32") throw new Error(`unexpected dtype ${dtype}: the page asks for float32`);
  const values = new Float32Array(bytes.length / 4);
  for (let i = 0; i < values.length; i++) values[i] = view.getFloat32(i * 4, true);
  return values;
}

function toBase64Array({ shape, values }) {
  const bytes = new Uint8Array(values.length * 4);
  const view = new DataView(bytes.buffer);
  values.forEach((v, i) => view.setFloat32(i * 4, v, true));
  let binary = "";
  const CHUNK = 0x8000; // String.fromCharCode takes its arguments on the stack
  for (let i = 0; i < bytes.length; i += CHUNK) {
    binary += String.fromCharCode(...bytes.subarray(i, i + CHUNK));
  }
  return { shape, data: btoa(binary), dtype: "float32" };
}
