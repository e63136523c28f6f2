// Reading a NumPy .npy file in the browser: a 2-D float array in C order.
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html

const MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // "\x93NUMPY"
const FLOAT_TYPES = { f4: 4, f8: 8 };

/** Parse a .npy file into {shape: [n, d], values: Float32Array}; throws with a reason. */
export function parseNpy(buffer) {
  const bytes = new Uint8Array(buffer);
  if (bytes.length < 12 || !MAGIC.every((b, i) => bytes[i] === b)) {
    throw new Error("not a .npy file (no \\x93NUMPY header)");
  }
  const view = new DataView(buffer);
  const major = bytes[6];
  const headerStart = major === 1 ? 10 : 12;
  const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const header = new TextDecoder(major >= 3 ? "utf-8" : "latin1").decode(
    bytes.subarray(headerStart, headerStart + headerLength),
  );
  const descr = /'descr':\s*'([<>|=])([a-z])(\d+)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shapeText) throw new Error("unreadable .npy header");
  const [, order, kind, size] = descr;
  const width = FLOAT_TYPES[kind + size];
  if (!width) throw new Error(`dtype ${kind}${size}: expected float32 or float64`);
  if (fortran[1] === "True") throw new Error("Fortran-ordered array: save it in C order");
  const shape = shapeText[1].split(",").map((s) => s.trim()).filter(Boolean).map(Number);
  if (shape.length !== 2) {
    throw new Error(`shape (${shape.join(", ")}): expected [n, d_model], one sequence`);
  }
  const count = shape[0] * shape[1];
  const offset = headerStart + headerLength;
  if (buffer.byteLength < offset + count * width) throw new Error(".npy file is cut short");
  const littleEndian = order !== ">";
  const values = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    const at = offset + i * width;
    values[i] = width === 4 ? view.getFloat32(at, littleEndian) : view.getFloat64(at, littleEndian);
  }
  return { shape, values };
}
