"""The model directory's contract: config.json written and read back as a typed Manifest."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from model_export import graph_io
from model_export.config import preset
from model_export.manifest import (
    FORMAT_VERSION,
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    GraphFile,
    Manifest,
    ManifestError,
    TextFrontEnd,
    open_model_file,
    resolve_file,
)
from model_export.model_files import FileChanged, open_checked

GRAPHS = {name: GraphFile("0" * 64, outputs) for name, outputs in graph_io.GRAPH_OUTPUTS.items()}
# What the first release wrote: no model_hidden.onnx, model_attn.onnx without hidden_states.
FIRST_RELEASE_GRAPHS = {
    graph_io.GRAPH_EMBEDDINGS: GraphFile("0" * 64, (graph_io.OUTPUT_HIDDEN,)),
    graph_io.GRAPH_ATTENTION: GraphFile(
        "0" * 64, (graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_ATTENTIONS)
    ),
}


def raw_graphs(graphs: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """The config.json form of ``graphs`` (file -> its outputs), with dummy digests."""
    return {
        name: {
            "outputs": {o: {"dtype": "float32", "shape": graph_io.SHAPES[o]} for o in outputs},
            "sha256": "0" * 64,
        }
        for name, outputs in graphs.items()
    }


def without(graph: str) -> dict[str, tuple[str, ...]]:
    """Every graph of this version but ``graph``, with its outputs."""
    return {name: outs for name, outs in graph_io.GRAPH_OUTPUTS.items() if name != graph}


def graphs_with(graph: str, outputs: tuple[str, ...]) -> dict[str, Any]:
    """A config.json change: every graph of this version, ``graph`` with ``outputs``."""
    return {"graphs": raw_graphs({**graph_io.GRAPH_OUTPUTS, graph: outputs})}


TEXT = dict(
    embeddings_graph="embeddings.onnx",
    embeddings_sha256="1" * 64,
    vocab_size=100,
    type_vocab_size=2,
    max_positions=128,
    tokenizer="tokenizer.json",
    tokenizer_sha256="2" * 64,
)


def manifest(**changes: Any) -> Manifest:
    base = Manifest(name="m", architecture=preset("tiny"), opset=18, graphs=GRAPHS)
    return dataclasses.replace(base, **changes)


def test_round_trip_keeps_every_field_and_the_record() -> None:
    text = TextFrontEnd(**TEXT, graph="text_model.onnx", graph_sha256="3" * 64)
    written = manifest(
        text=text,
        pooling="last",
        normalize=True,
        matryoshka_dimensions=(32, 16),
        prompts={"query": "query: "},
        default_prompt_name="query",
        include_prompt=False,
        record={"seed": 3, "validation": {"atol": 1e-4}},
    )
    raw = json.loads(json.dumps(written.to_dict()))  # through JSON, as on disk
    read = Manifest.from_dict(raw)
    assert read == written and read.record == written.record
    assert (read.pooling, read.include_prompt) == ("last", False)
    assert raw["format_version"] == FORMAT_VERSION
    assert read.graphs == GRAPHS  # digests and outputs, in order
    assert [g.outputs for g in read.graphs.values()] == list(graph_io.GRAPH_OUTPUTS.values())
    assert read.files() == {
        **{name: g.sha256 for name, g in GRAPHS.items()},
        "embeddings.onnx": "1" * 64,
        "tokenizer.json": "2" * 64,
        "text_model.onnx": "3" * 64,
    }
    assert read.has_tokenizer
    assert read.has_hidden_states
    assert read.text_graph == "text_model.onnx"


def test_format_2_text_has_no_text_graph() -> None:
    """format_version 2 wrote no text graph: its text runs embeddings.onnx, then the encoder."""
    raw = manifest(text=TextFrontEnd(**TEXT), format_version=2).to_dict()
    read = Manifest.from_dict(json.loads(json.dumps(raw)))
    assert read.format_version == 2 and read.has_tokenizer
    assert read.text_graph is None
    assert "text_model.onnx" not in read.files()


def test_the_first_release_format_is_still_read(tiny_model_dir: Path) -> None:
    """format_version 1 had no pooling section: read with no pooling, no normalisation
    (nor prompts: a prompt a request gives is pooled in)."""
    raw = json.loads((tiny_model_dir / graph_io.CONFIG_FILE).read_text())
    dropped = ("pooling", "normalize", "matryoshka_dimensions", "prompts", "include_prompt")
    for key in (*dropped, "weights", "weights_sha256"):
        raw.pop(key)
    raw["format_version"] = 1
    read = Manifest.from_dict(raw)
    assert (read.pooling, read.normalize, read.matryoshka_dimensions) == (None, False, ())
    assert (read.prompts, read.include_prompt) == ({}, True)
    # Nor per-layer hidden states: two graphs, the attention graph without them.
    raw["graphs"].pop(graph_io.GRAPH_HIDDEN_STATES)
    for graph in graph_io.COMPACT_GRAPHS:  # formats 6 and 7
        raw["graphs"].pop(graph)
    raw["graphs"][graph_io.GRAPH_ATTENTION]["outputs"].pop(graph_io.OUTPUT_HIDDEN_STATES)
    raw["graphs"][graph_io.GRAPH_ATTENTION]["outputs"].pop(graph_io.OUTPUT_VALUE_NORMS)
    read = Manifest.from_dict(raw)
    assert list(read.graphs) == [graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_ATTENTION]
    assert read.graphs[graph_io.GRAPH_ATTENTION].outputs == (
        graph_io.OUTPUT_HIDDEN,
        graph_io.OUTPUT_ATTENTIONS,
    )
    assert not read.has_hidden_states and not read.has_value_norms
    assert set(read.files()) == {graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_ATTENTION}


def test_has_hidden_states_needs_both_graphs_to_give_them() -> None:
    assert manifest().has_hidden_states
    assert not manifest(graphs=FIRST_RELEASE_GRAPHS).has_hidden_states
    # model_hidden.onnx alone is not enough: a request with attention runs model_attn.onnx.
    with_hidden = {
        **FIRST_RELEASE_GRAPHS,
        graph_io.GRAPH_HIDDEN_STATES: GRAPHS[graph_io.GRAPH_HIDDEN_STATES],
    }
    assert not manifest(graphs=with_hidden).has_hidden_states
    # Nor the attention graph's hidden_states without model_hidden.onnx.
    without_hidden = {k: GRAPHS[k] for k in without(graph_io.GRAPH_HIDDEN_STATES)}
    assert not manifest(graphs=without_hidden).has_hidden_states


LLM: dict[str, Any] = {
    "template": {
        "pieces": ["<I>", "<Q>", "<D>", "<end>"],
        "slots": ["instruction", "query", "document"],
    },
    "bare": {"pieces": ["<Q>", "<D>", "<end>"], "slots": ["query", "document"]},
    "answers": ["yes", "no"],
    "answer_ids": [1, 2],
}


def llm_with(**changed: Any) -> dict[str, Any]:
    return {"text": TEXT, "head": {**HEAD, "llm": {**LLM, **changed}}}


HEAD = {
    "task": "classify",
    "graph": graph_io.GRAPH_SCORES,
    "graph_sha256": "0" * 64,
    "labels": ["LABEL_0"],
    "activation": "sigmoid",
}


# sentence-transformers' Dense layers after pooling (format 8): tiny's d_model is 32.
LAYER = {"in_features": 32, "out_features": 16, "bias": True, "activation": "tanh"}
DENSE = {"file": "dense.bin", "sha256": "4" * 64, "layers": [LAYER]}


def test_dense_layers_round_trip_and_set_the_pooled_width() -> None:
    second = {**LAYER, "in_features": 16, "out_features": 8, "bias": False}
    raw = {**manifest(pooling="cls").to_dict(), "dense": {**DENSE, "layers": [LAYER, second]}}
    raw["matryoshka_dimensions"] = [8, 4]
    read = Manifest.from_dict(json.loads(json.dumps(raw)))
    assert read.dense is not None and [x.out_features for x in read.dense.layers] == [16, 8]
    assert read.dense.floats == 16 * 33 + 8 * 16
    assert (read.pooled_width, read.architecture.d_model) == (8, 32)
    assert read.files()["dense.bin"] == "4" * 64
    assert Manifest.from_dict(json.loads(json.dumps(read.to_dict()))) == read
    assert manifest().pooled_width == 32


def dense_with(**layer: Any) -> dict[str, Any]:
    return {"pooling": "cls", "dense": {**DENSE, "layers": [{**LAYER, **layer}]}}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"format_version": 10}, "format_version 10 is not supported"),
        ({"format_version": None}, "format_version None"),
        ({"pooling": "sum"}, "pooling must be one of"),
        ({"matryoshka_dimensions": [33]}, "1..32"),
        ({"matryoshka_dimensions": "32"}, "must be a list"),
        ({"graphs": {}}, "graphs lacks"),
        ({"graphs": raw_graphs(without(graph_io.GRAPH_ATTENTION))}, "graphs lacks model_attn.onnx"),
        (  # an output the file does not have
            graphs_with("model.onnx", ("last_hidden_state", "hidden_states")),
            "graphs.model.onnx has unexpected outputs",
        ),
        (  # last_hidden_state must come first
            graphs_with("model_hidden.onnx", ("hidden_states", "last_hidden_state")),
            "graphs.model_hidden.onnx has unexpected outputs",
        ),
        (  # no outputs at all
            graphs_with("model_attn.onnx", ()),
            "graphs.model_attn.onnx has unexpected outputs []",
        ),
        (  # a graph file this version does not know
            graphs_with("other.onnx", ("last_hidden_state",)),
            "graphs.other.onnx has unexpected outputs",
        ),
        ({"architecture": {"d_model": 30, "n_heads": 4}}, "divisible"),
        ({"text": {"embeddings_graph": "e.onnx"}}, "text:"),
        (  # a text graph without its digest could never be verified
            {"text": {**TEXT, "graph": "text_model.onnx"}},
            "text.graph and text.graph_sha256 go together",
        ),
        ({"opset": "eighteen"}, "eighteen"),
        # sentence-transformers' prompts come from an untrusted directory: bounded
        ({"prompts": {f"p{i}": "x" for i in range(65)}}, "at most 64 prompts"),
        ({"prompts": ["query: "]}, "at most 64 prompts"),
        ({"prompts": {"": "x"}}, "name must be 1..64"),
        ({"prompts": {"q": "x" * 2049}}, "at most 2048"),
        ({"prompts": {"q": 3}}, "at most 2048"),
        ({"prompts": {"q": "query: "}, "default_prompt_name": "p"}, "not one of the prompts"),
        ({"include_prompt": "false"}, "include_prompt must be a boolean"),
        # a head (model_export.heads) is read from an untrusted directory too
        ({"text": TEXT, "head": {**HEAD, "task": "rerank"}}, "head.task must be one of"),
        ({"text": TEXT, "head": {**HEAD, "graph": "../scores_model.onnx"}}, "head.graph"),
        ({"text": TEXT, "head": {**HEAD, "graph": "model.onnx"}}, "head.graph must be one of"),
        ({"text": TEXT, "head": {**HEAD, "graph": "splade_model.onnx"}}, "head.graph of a"),
        ({"text": TEXT, "head": {**HEAD, "labels": []}}, "head.labels must list 1..4096"),
        ({"text": TEXT, "head": {**HEAD, "labels": ["x"] * 4097}}, "head.labels must list"),
        ({"text": TEXT, "head": {**HEAD, "labels": "abc"}}, "its labels a list"),
        ({"text": TEXT, "head": {**HEAD, "labels": [3]}}, "each is text of 1..256"),
        ({"text": TEXT, "head": {**HEAD, "activation": "tanh"}}, "head.activation must be"),
        ({"text": TEXT, "head": {**HEAD, "extra": 1}}, "head:"),
        ({"head": HEAD}, "a head reads token ids"),
        # an LLM reranker's prompt template (model_export.llm_rerank) too
        ({"text": TEXT, "head": {**HEAD, "llm": "x"}}, "head.llm must be an object"),
        ({"text": TEXT, "head": {**HEAD, "labels": ["a", "b"], "llm": LLM}}, "one label"),
        (llm_with(bare={"pieces": ["a", "b"], "slots": ["query"]}), "hold the query and the doc"),
        (llm_with(bare={"pieces": ["", "", ""], "slots": ["document", "query"]}), "before the"),
        (llm_with(bare={"pieces": ["", "", ""], "slots": ["query", "query"]}), "distinct"),
        (llm_with(bare={"pieces": ["", ""], "slots": ["query", "document"]}), "one more piece"),
        (llm_with(bare=LLM["template"]), "bare template: it holds no instruction"),
        (llm_with(answer_ids=[-1, 2]), "answer_ids"),
        (llm_with(answers=["yes"]), "1..2 tokens"),
        (llm_with(extra=1), "head.llm:"),
        ({"quantization_ranges": [[0.0] * 32]}, "must be [mins, maxes]"),
        ({"quantization_ranges": [[0.0] * 31, [1.0] * 31]}, "of 32 finite numbers each"),
        ({"quantization_ranges": [[True] * 32, [1.0] * 32]}, "numbers only"),
        ({"quantization_ranges": [[1e400] * 32, [1.0] * 32]}, "finite"),
        # Dense layers (format 8) are read from an untrusted directory too
        ({"dense": DENSE}, "its layers follow a pooling"),
        (dense_with(in_features=16), "its layers follow a pooling of d_model-wide vectors"),
        (dense_with(out_features=0), "dense.out_features must be an integer in 1..65536"),
        (dense_with(out_features=1 << 40), "dense.out_features must be an integer"),
        (dense_with(activation="gelu"), "activation one of"),
        (dense_with(bias="yes"), "bias must be a boolean"),
        (dense_with(extra=1), "dense:"),
        ({"pooling": "cls", "dense": {**DENSE, "layers": []}}, "dense.layers must list 1..8"),
        ({"pooling": "cls", "dense": {**DENSE, "layers": [LAYER] * 9}}, "must list 1..8"),
        ({"pooling": "cls", "dense": {**DENSE, "layers": [LAYER, LAYER]}}, "the last's out"),
        ({"pooling": "cls", "dense": {**DENSE, "file": "../dense.bin"}}, "dense.file"),
        ({"pooling": "cls", "dense": [LAYER]}, "dense must be an object"),
        ({"pooling": "cls", "dense": {**DENSE, "layers": [3]}}, "dense.layers must be objects"),
        ({**dense_with(), "format_version": 7}, "written since format_version 8"),
        ({**dense_with(), "matryoshka_dimensions": [17]}, "1..16"),
        (
            {**dense_with(), "quantization_ranges": [[0.0] * 32, [1.0] * 32]},
            "of 16 finite numbers each",
        ),
    ],
)
def test_invalid_manifests_are_refused(change: dict[str, Any], says: str) -> None:
    raw = {**manifest().to_dict(), **change}
    with pytest.raises(ManifestError) as caught:
        Manifest.from_dict(raw)
    assert says in str(caught.value)


def test_an_llm_rerankers_template_round_trips_and_other_heads_write_none() -> None:
    """head.llm is written and read back as given; a head without one writes no key."""
    llm = Manifest.from_dict({**manifest().to_dict(), **llm_with()})
    assert llm.head is not None and llm.head.llm is not None
    written = json.loads(json.dumps(llm.to_dict()))["head"]["llm"]
    assert written == {**LLM, "default_instruction": None}
    text, spans = llm.head.llm.prompt("find")[0].render(
        {"instruction": "find", "query": "q", "document": "d"}
    )
    assert text == "<I>find<Q>q<D>d<end>" and text[slice(*spans["document"])] == "d"
    assert llm.head.llm.prompt("")[0] == llm.head.llm.bare  # "" asks for none
    plain = Manifest.from_dict({**manifest().to_dict(), "text": TEXT, "head": HEAD})
    assert "llm" not in plain.to_dict()["head"]


def test_missing_key_is_named() -> None:
    raw = manifest().to_dict()
    del raw["architecture"]
    with pytest.raises(ManifestError, match="lacks 'architecture'"):
        Manifest.from_dict(raw)


def test_verify_names_a_missing_or_corrupt_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    read = Manifest.read(model)
    read.verify(model)  # the export's own digests match
    with (model / graph_io.GRAPH_ATTENTION).open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ManifestError, match=r"model_attn\.onnx is corrupt"):
        read.verify(model)
    (model / graph_io.GRAPH_ATTENTION).unlink()
    with pytest.raises(ManifestError, match=r"model_attn\.onnx is missing"):
        read.verify(model)


def test_read_refuses_what_is_not_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="is missing"):
        Manifest.read(tmp_path)
    (tmp_path / graph_io.CONFIG_FILE).write_text("[1, 2]")
    with pytest.raises(ManifestError, match="not a JSON object"):
        Manifest.read(tmp_path)
    (tmp_path / graph_io.CONFIG_FILE).write_text("{")
    with pytest.raises(ManifestError, match="not readable JSON"):
        Manifest.read(tmp_path)


# -- a model directory is untrusted input --------------------------------------------------


@pytest.mark.parametrize(
    "name", ["/etc/hostname", "../tiny2/model.onnx", "sub/model.onnx", "..", ".hidden", "a\\b", ""]
)
@pytest.mark.parametrize("where", ["tokenizer", "stopwords", "embeddings_graph", "graph"])
def test_text_files_must_be_plain_names(name: str, where: str) -> None:
    """Each file the text front end names stays in the model directory: no path at all."""
    text = {**TEXT, "graph": "text_model.onnx", "graph_sha256": "3" * 64}
    text = {**text, "stopwords": "stopwords.txt", "stopwords_sha256": "4" * 64}
    raw = {**manifest().to_dict(), "text": {**text, where: name}}
    with pytest.raises(ManifestError, match=f"text.{where} must be a plain file name"):
        Manifest.from_dict(raw)


def test_graph_files_must_be_plain_names() -> None:
    raw = manifest().to_dict()
    raw["graphs"]["../model.onnx"] = raw["graphs"].pop(graph_io.GRAPH_EMBEDDINGS)
    with pytest.raises(ManifestError, match="must be a plain file name"):
        Manifest.from_dict(raw)


def test_a_file_linked_from_outside_is_refused_and_no_digest_is_told(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A symbolic link leaving the directory is refused before anything is read; a wrong
    file says it does not match, never what its digest is (a hash oracle)."""
    model = tmp_path / "repo" / "tiny"
    shutil.copytree(tiny_model_dir, model)
    outside = tmp_path / "secret.onnx"
    outside.write_bytes(b"secret")
    (model / graph_io.GRAPH_ATTENTION).unlink()
    (model / graph_io.GRAPH_ATTENTION).symlink_to(outside)
    read = Manifest.read(model)
    with pytest.raises(ManifestError, match="resolves outside the model directory") as info:
        read.verify(model)
    assert str(tmp_path) not in str(info.value)
    # Within the repository, a link is followed; the content is then checked.
    with pytest.raises(ManifestError, match="resolves outside the model repository"):
        read.verify(model, tmp_path / "repo")
    with pytest.raises(ManifestError, match=r"model_attn\.onnx is corrupt") as info:
        read.verify(model, tmp_path)
    digest = hashlib.sha256(b"secret").hexdigest()
    assert digest not in str(info.value) and str(tmp_path) not in str(info.value)


def test_a_model_directory_linked_from_outside_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "tiny").symlink_to(tiny_model_dir)
    with pytest.raises(ManifestError, match=r"config\.json resolves outside the model repository"):
        Manifest.read(tmp_path / "repo" / "tiny", tmp_path / "repo")


def test_files_beyond_the_bound_are_refused_before_hashing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    read = Manifest.read(tiny_model_dir)
    total = sum((tiny_model_dir / name).stat().st_size for name in read.files())
    assert read.verify(tiny_model_dir, max_bytes=total)
    with pytest.raises(ManifestError, match="more than the"):
        read.verify(tiny_model_dir, max_bytes=total - 1)


def test_config_json_size_and_depth_are_bounded_before_parsing(tmp_path: Path) -> None:
    config = tmp_path / graph_io.CONFIG_FILE
    raw = manifest().to_dict()
    config.write_text(json.dumps({**raw, "padding": "x" * MAX_CONFIG_BYTES}))
    with pytest.raises(ManifestError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        Manifest.read(tmp_path)
    nested: Any = '[ { " ] ] ] \\'  # brackets inside strings do not count
    for _ in range(MAX_CONFIG_DEPTH):
        nested = [nested]
    config.write_text(json.dumps({**raw, "deep": nested}))
    with pytest.raises(ManifestError, match=f"nests deeper than {MAX_CONFIG_DEPTH}"):
        Manifest.read(tmp_path)
    config.write_text(json.dumps({**raw, "deep": nested[0]}))
    assert Manifest.read(tmp_path).record["deep"] == nested[0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("vocab_size", 1 << 30), ("max_positions", 1 << 30), ("type_vocab_size", 0)],
)
def test_text_sizes_are_bounded(field: str, value: int) -> None:
    raw = {**manifest().to_dict(), "text": {**TEXT, field: value}}
    with pytest.raises(ManifestError, match=f"text.{field} must be an integer in 1.."):
        Manifest.from_dict(raw)


def test_estimated_bytes_grows_with_the_architecture() -> None:
    """One byte per weight per graph: d_model 2^16 is gigabytes before anything is run."""
    small = manifest().estimated_bytes()
    wide = manifest(architecture=preset("tiny", d_model=1 << 16, d_ff=1 << 16)).estimated_bytes()
    assert 0 < small < 2**20 and wide > 2**36


def test_the_depth_scan_is_linear_in_an_unterminated_string(tmp_path: Path) -> None:
    """`"\"\"\"...` never closed: a scan whose strings needed their closing quote
    backtracked from each quote to the end (hours for 1 MiB); now the parser refuses it."""
    (tmp_path / graph_io.CONFIG_FILE).write_bytes(b'{"x": "' + b'\\"' * (MAX_CONFIG_BYTES // 2 - 8))
    with pytest.raises(ManifestError, match="not readable JSON"):
        Manifest.read(tmp_path)


def test_a_file_swapped_for_a_link_after_its_check_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The link-check race: a file's path is checked (``resolve_file``), then the file is
    swapped for a symbolic link out of the directory before it is opened. Opening the
    checked path (``open_checked``, what ``open_model_file`` does after the check) refuses
    it instead of following the link."""
    model = tmp_path / "repo" / "tiny"
    shutil.copytree(tiny_model_dir, model)
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    real = resolve_file(model, graph_io.CONFIG_FILE)  # checked: inside, no link
    real.unlink()
    real.symlink_to(outside)  # swapped in after the check
    with pytest.raises(FileChanged, match="became a symbolic link"):
        open_checked(real, model.resolve())
    # Through the manifest the link is now seen by the path check itself.
    with pytest.raises(ManifestError, match="resolves outside the model directory"):
        Manifest.read(model)


def test_a_directory_swapped_for_a_link_after_its_check_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The same race one level up: the model directory itself is swapped for a link to a
    copy outside the repository. The file's own name is no link, so ``O_NOFOLLOW``
    alone would open the copy; the opened file's path, read from its descriptor, is
    outside the bound and refused."""
    repo = tmp_path / "repo"
    model = repo / "tiny"
    shutil.copytree(tiny_model_dir, model)
    copy = tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, copy)
    real = resolve_file(model, graph_io.CONFIG_FILE, repo)
    model.rename(repo / "old")
    model.symlink_to(copy)  # swapped in after the check
    with pytest.raises(FileChanged, match="out of bounds"):
        open_checked(real, repo.resolve())


def test_every_model_file_is_read_through_the_checked_open(tiny_model_dir: Path) -> None:
    """``open_model_file`` opens what the check allowed (the manifest's reads and hashes
    go through it): the file's bytes, and a plain file only."""
    with open_model_file(tiny_model_dir, graph_io.CONFIG_FILE) as f:
        assert f.read() == (tiny_model_dir / graph_io.CONFIG_FILE).read_bytes()
    with pytest.raises(ManifestError, match="not a regular file"):
        open_model_file(tiny_model_dir.parent, tiny_model_dir.name)
