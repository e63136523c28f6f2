"""The model directory's typed, versioned contract: ``config.json`` as a :class:`Manifest`.

``model_export`` writes it; the service reads a model directory only through
this module (torch-free, numpy-free). Names of files, inputs and outputs come
from :mod:`model_export.graph_io`, the architecture from
:class:`~model_export.config.EncoderConfig`; both are re-exported here so a
reader needs nothing else from ``model_export``.

Format versions: 1 (the first release: no pooling section, no hidden states) is
still read, with the defaults of the time (no default pooling, no
normalisation); 2 adds ``pooling``, ``normalize``, ``matryoshka_dimensions``
and per-layer hidden states (``model_hidden.onnx``, and a ``hidden_states``
output of ``model_attn.onnx``); 3 adds the text graph (``text.graph``: token
ids to ``last_hidden_state`` in one run); 4 adds BM42's sparse graph
(``text.sparse_graph``: the last layer's [CLS] attention row), its stopword
list (``text.stopwords``) and the attention graph's ``value_norms`` output.
Each graph records its outputs, so a reader knows what a directory can answer
whatever its version; a version-2
directory with a tokenizer still serves text, through ``embeddings.onnx`` and
then the encoder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from model_export import graph_io
from model_export.config import ConfigError, EncoderConfig

__all__ = [
    "FORMAT_VERSION",
    "POOLINGS",
    "ConfigError",
    "EncoderConfig",
    "GraphFile",
    "Manifest",
    "ManifestError",
    "Pooling",
    "TextFrontEnd",
    "graph_io",
    "sha256_file",
]

FORMAT_VERSION: Final = 4
READABLE_VERSIONS: Final = (1, 2, 3, 4)

Pooling = Literal["mean", "cls", "max"]
POOLINGS: Final[tuple[str, ...]] = ("mean", "cls", "max")


class ManifestError(ValueError):
    """A model directory whose ``config.json`` or files do not keep the contract."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class GraphFile:
    """One ONNX graph of the model directory: its digest and its outputs, in order."""

    sha256: str
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class TextFrontEnd:
    """Token ids -> the encoder's input embeddings (``embeddings.onnx``), a tokenizer,
    and (format 3) ``graph``: ids -> ``last_hidden_state`` in one run."""

    embeddings_graph: str
    embeddings_sha256: str
    vocab_size: int
    type_vocab_size: int
    max_positions: int
    tokenizer: str | None = None
    tokenizer_sha256: str | None = None
    graph: str | None = None
    graph_sha256: str | None = None
    sparse_graph: str | None = None  # format 4: ids -> the last layer's [CLS] attention row
    sparse_graph_sha256: str | None = None
    stopwords: str | None = None  # format 4: words left out of BM42 vectors, one per line
    stopwords_sha256: str | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "type_vocab_size", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ManifestError(f"text.{name} must be a positive integer, got {value!r}")
        if (self.tokenizer is None) != (self.tokenizer_sha256 is None):
            raise ManifestError("text.tokenizer and text.tokenizer_sha256 go together")
        for name in ("graph", "sparse_graph", "stopwords"):
            if (getattr(self, name) is None) != (getattr(self, f"{name}_sha256") is None):
                raise ManifestError(f"text.{name} and text.{name}_sha256 go together")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TextFrontEnd:
        try:
            return cls(**data)
        except TypeError as exc:  # unknown or missing keys
            raise ManifestError(f"text: {exc}") from None


@dataclass(frozen=True)
class Manifest:
    """Everything a server needs to know about a model directory, and its provenance.

    ``pooling``/``normalize`` are the model's own sentence-embedding recipe
    (sentence-transformers' ``1_Pooling/config.json``), used by protocols that
    answer one vector per text (OpenAI embeddings). ``matryoshka_dimensions``
    lists the prefix lengths the model was trained to be truncated to; empty
    means truncation is not supported.
    """

    name: str
    architecture: EncoderConfig
    opset: int
    graphs: dict[str, GraphFile]
    text: TextFrontEnd | None = None
    pooling: Pooling | None = None
    normalize: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    format_version: int = FORMAT_VERSION
    # Provenance: recorded for people, never read by the server.
    record: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.format_version not in READABLE_VERSIONS:
            raise ManifestError(
                f"format_version {self.format_version!r} is not supported (this version reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}): re-export the model"
            )
        missing = sorted(set(graph_io.REQUIRED_GRAPHS) - set(self.graphs))
        if missing:
            raise ManifestError(f"graphs lacks {', '.join(missing)}")
        for name, graph in self.graphs.items():
            unknown = set(graph.outputs) - set(graph_io.GRAPH_OUTPUTS.get(name, ()))
            if unknown or graph.outputs[:1] != (graph_io.OUTPUT_HIDDEN,):
                raise ManifestError(f"graphs.{name} has unexpected outputs {list(graph.outputs)}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ManifestError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        d_model = self.architecture.d_model
        for dim in self.matryoshka_dimensions:
            if isinstance(dim, bool) or not isinstance(dim, int) or not 0 < dim <= d_model:
                raise ManifestError(
                    f"matryoshka_dimensions must be integers in 1..{d_model}, got {dim!r}"
                )

    @property
    def has_tokenizer(self) -> bool:
        return self.text is not None and self.text.tokenizer is not None

    @property
    def text_graph(self) -> str | None:
        """The one-run text graph (format 3), if the directory has it."""
        return None if self.text is None else self.text.graph

    @property
    def has_value_norms(self) -> bool:
        """The attention graph gives value norms (format 4): attention norms can be asked."""
        return graph_io.OUTPUT_VALUE_NORMS in self.graphs[graph_io.GRAPH_ATTENTION].outputs

    @property
    def has_hidden_states(self) -> bool:
        """Per-layer hidden states (written since format_version 2): both graphs give them."""
        hidden = self.graphs.get(graph_io.GRAPH_HIDDEN_STATES)
        return (
            hidden is not None
            and graph_io.OUTPUT_HIDDEN_STATES in hidden.outputs
            and graph_io.OUTPUT_HIDDEN_STATES in self.graphs[graph_io.GRAPH_ATTENTION].outputs
        )

    def files(self) -> dict[str, str]:
        """Every file the model directory must hold -> its SHA-256."""
        files = {name: graph.sha256 for name, graph in self.graphs.items()}
        if self.text is not None:
            files[self.text.embeddings_graph] = self.text.embeddings_sha256
            if self.text.tokenizer is not None and self.text.tokenizer_sha256 is not None:
                files[self.text.tokenizer] = self.text.tokenizer_sha256
            for name in ("graph", "sparse_graph", "stopwords"):
                file, digest = getattr(self.text, name), getattr(self.text, f"{name}_sha256")
                if file is not None and digest is not None:
                    files[file] = digest
        return files

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "name": self.name,
            "architecture": self.architecture.to_dict(),
            "opset": self.opset,
            "inputs": {
                n: {"dtype": dt, "shape": graph_io.SHAPES[n]}
                for n, dt in ((graph_io.INPUT_EMBEDS, "float32"), (graph_io.INPUT_MASK, "int64"))
            },
            "graphs": {
                f: {
                    "outputs": {
                        o: {"dtype": "float32", "shape": graph_io.SHAPES[o]} for o in g.outputs
                    },
                    "sha256": g.sha256,
                }
                for f, g in self.graphs.items()
            },
            "text": None if self.text is None else asdict(self.text),
            "pooling": self.pooling,
            "normalize": self.normalize,
            "matryoshka_dimensions": list(self.matryoshka_dimensions),
            **self.record,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Manifest:
        """Parse a ``config.json`` object; ManifestError names what is wrong."""
        known = {"format_version", "name", "architecture", "opset", "inputs", "graphs", "text"}
        known |= {"pooling", "normalize", "matryoshka_dimensions"}
        try:
            text = raw.get("text")
            dims = raw.get("matryoshka_dimensions") or []
            if not isinstance(dims, list):
                raise ManifestError("matryoshka_dimensions must be a list")
            return cls(
                format_version=raw["format_version"],
                name=str(raw["name"]),
                architecture=EncoderConfig.from_dict(raw["architecture"]),
                opset=int(raw["opset"]),
                graphs={
                    f: GraphFile(str(g["sha256"]), tuple(g["outputs"]))
                    for f, g in raw["graphs"].items()
                },
                text=TextFrontEnd.from_dict(text) if text else None,
                pooling=raw.get("pooling"),
                normalize=bool(raw.get("normalize", False)),
                matryoshka_dimensions=tuple(dims),
                record={k: v for k, v in raw.items() if k not in known},
            )
        except ManifestError:
            raise
        except KeyError as exc:
            raise ManifestError(f"lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as exc:  # ConfigError is a ValueError
            raise ManifestError(str(exc)) from exc

    @classmethod
    def read(cls, model_dir: Path) -> Manifest:
        """Read ``config.json`` of ``model_dir`` (files are not checked: see ``verify``)."""
        path = model_dir / graph_io.CONFIG_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ManifestError(f"{path} is missing") from None
        except (OSError, ValueError) as exc:
            raise ManifestError(f"{path} is not readable JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ManifestError(f"{path} is not a JSON object")
        try:
            return cls.from_dict(raw)
        except ManifestError as exc:
            raise ManifestError(f"{path} is invalid: {exc}") from None

    def write(self, model_dir: Path) -> None:
        (model_dir / graph_io.CONFIG_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def verify(self, model_dir: Path) -> None:
        """Check that every file is present and matches its recorded SHA-256."""
        for name, want in self.files().items():
            path = model_dir / name
            if not path.is_file():
                raise ManifestError(f"{path} is missing")
            got = sha256_file(path)
            if got != want:
                raise ManifestError(
                    f"{path} is corrupt: SHA-256 {got} does not match {want} recorded in "
                    f"{graph_io.CONFIG_FILE}"
                )


@contextmanager
def staged_model_dir(out_dir: Path) -> Iterator[Path]:
    """A staging directory beside ``out_dir`` that replaces it only when the block succeeds,
    so a failed export leaves nothing a server could load (and the old one in place)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes it private; a model directory is not secret
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
