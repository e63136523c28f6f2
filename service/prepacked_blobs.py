"""An optimised graph's weights moved into content-addressed blobs (the session cache's).

onnxruntime writes a graph it optimised with one data file beside it: each external
initializer's bytes, then its pre-packed forms, each named in the initializer's
``external_data`` (``location``, ``offset``, ``length``, and per pre-packing kernel
``prepacked_N`` = ``KEY|offset;length;checksum[|...]``, offsets into the same file; the
checksum is ``0``, not checked). Two graphs of one model hold the same weights, so most
of their data files are the same bytes, yet each is a file of its own and each session
maps its own copy.

:func:`rewrite` gives each initializer one blob: its original bytes at offset 0, then
each pre-packed buffer at the next multiple of the page size (onnxruntime maps a buffer
only at an offset it can map), named by the SHA-256 of the whole blob. The graph's
entries then point at ``blobs/<sha>``: a location inside the graph's folder, the only
kind onnxruntime accepts. Every graph (and every model) whose tensor and pre-packed
forms are the same bytes names the same blob, so the page cache holds it once.

onnx is no serving dependency: the graph is edited in protobuf's wire format, every
field but the external data copied as it was.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

BLOBS = "blobs"
# onnxruntime maps a pre-packed buffer at an offset that is a multiple of this.
ALIGNMENT = mmap.ALLOCATIONGRANULARITY

# Protobuf field numbers of onnx.proto's messages, the ones that can hold a tensor.
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_ATTRIBUTE = 5
_ATTR_TENSOR, _ATTR_GRAPH, _ATTR_TENSORS, _ATTR_GRAPHS = 5, 6, 10, 11
_TENSOR_EXTERNAL_DATA = 13
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_LEN = 2  # the wire type of a length-delimited field

# Stores one blob's bytes, returning its name (the SHA-256 of its bytes).
Store = Callable[[bytes], str]


class BadGraph(ValueError):
    """The file is not an ONNX graph this module can rewrite."""


def rewrite(graph: Path, data: Path, store: Store) -> bytes:
    """``graph`` with each external initializer's bytes (in ``data``) handed to
    ``store`` and its entries pointing at the blob: the new graph file's bytes."""
    with data.open("rb") as file:
        size = data.stat().st_size
        # An empty data file cannot be mapped: nothing points into it then.
        view = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            return _Rewriter(view, data.name, store).model(graph.read_bytes())
        finally:
            if isinstance(view, mmap.mmap):
                view.close()


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise BadGraph("a varint runs past its message")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes, bytes]]:
    """Each field of a message: its number, wire type, payload (a length-delimited
    field's bytes; empty otherwise) and the field's whole encoding."""
    pos = 0
    while pos < len(buf):
        start = pos
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        payload = b""
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == _LEN:
            length, pos = _varint(buf, pos)
            payload, pos = buf[pos : pos + length], pos + length
        else:
            raise BadGraph(f"wire type {wire} (field {number}) is not onnx's")
        if pos > len(buf):
            raise BadGraph(f"field {number} runs past its message")
        yield number, wire, payload, buf[start:pos]


def _field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _edit(buf: bytes, edits: Mapping[int, Callable[[bytes], bytes]]) -> bytes:
    """``buf`` with each length-delimited field named in ``edits`` passed through it."""
    out = bytearray()
    for number, wire, payload, whole in _fields(buf):
        edit = edits.get(number) if wire == _LEN else None
        out += whole if edit is None else _field(number, edit(payload))
    return bytes(out)


class _Rewriter:
    def __init__(self, data: bytes | mmap.mmap, data_name: str, store: Store) -> None:
        self.data = data
        self.data_name = data_name
        self.store = store

    def model(self, buf: bytes) -> bytes:
        return _edit(buf, {_MODEL_GRAPH: self.graph})

    def graph(self, buf: bytes) -> bytes:
        return _edit(buf, {_GRAPH_NODE: self.node, _GRAPH_INITIALIZER: self.tensor})

    def node(self, buf: bytes) -> bytes:
        return _edit(buf, {_NODE_ATTRIBUTE: self.attribute})

    def attribute(self, buf: bytes) -> bytes:
        edits = {_ATTR_TENSOR: self.tensor, _ATTR_TENSORS: self.tensor}
        return _edit(buf, edits | {_ATTR_GRAPH: self.graph, _ATTR_GRAPHS: self.graph})

    def _bytes(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > len(self.data):
            raise BadGraph(f"{offset}+{length} runs past {self.data_name}")
        return bytes(self.data[offset : offset + length])

    def tensor(self, buf: bytes) -> bytes:
        kept, entries = bytearray(), []
        for number, wire, payload, whole in _fields(buf):
            if number == _TENSOR_EXTERNAL_DATA and wire == _LEN:
                pair = {n: p.decode() for n, w, p, _ in _fields(payload) if w == _LEN}
                entries.append((pair.get(_ENTRY_KEY, ""), pair.get(_ENTRY_VALUE, "")))
            else:
                kept += whole
        if not entries:
            return buf
        found = dict(entries)
        if found.get("location") != self.data_name:
            raise BadGraph(f"an initializer's data is in {found.get('location')!r}")
        length = int(found.get("length", "0"))
        blob = bytearray(self._bytes(int(found.get("offset", "0")), length))
        moved: list[tuple[str, str]] = []
        for key, value in entries:
            if key.startswith("prepacked"):
                kernel, *buffers = value.split("|")
                placed = []
                for buffer in buffers:
                    offset, size, checksum = buffer.split(";")
                    blob += bytes(-len(blob) % ALIGNMENT)
                    placed.append(f"{len(blob)};{size};{checksum}")
                    blob += self._bytes(int(offset), int(size))
                moved.append((key, "|".join([kernel, *placed])))
            elif key not in ("location", "offset", "length"):
                moved.append((key, value))  # the checksum, say: of the same bytes
        name = self.store(bytes(blob))
        head = [("location", f"{BLOBS}/{name}"), ("offset", "0"), ("length", str(length))]
        for key, value in head + moved:
            entry = _field(_ENTRY_KEY, key.encode()) + _field(_ENTRY_VALUE, value.encode())
            kept += _field(_TENSOR_EXTERNAL_DATA, entry)
        return bytes(kept)
