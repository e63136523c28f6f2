"""A checkpoint named by a directory or by a Hugging Face Hub id: where its files are.

``--checkpoint`` takes either. An existing directory is a directory. Anything else
that reads as a repository id, with an optional ``@revision`` (a branch, a tag or a
commit: ``BAAI/bge-small-en-v1.5``, ``org/name@v1.0``, ``org/name@<40 hex>``), is
fetched through ``huggingface_hub``'s ``snapshot_download``, so its cache
(``HF_HOME``/``HF_HUB_CACHE``), ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` apply as they do
for every other Hugging Face tool. Only the files the export reads are fetched
(``allow_patterns``): ``config.json``, the tokenizer's files, sentence-transformers'
files and module folders, and the weights, ``model.safetensors`` or, only where a
folder has none, ``pytorch_model.bin``.

What was read is recorded: the commit the revision resolved to and each file's
SHA-256 (:meth:`ResolvedCheckpoint.provenance`, the manifest's ``record``); a
directory's files are hashed too. Every failure is one :class:`CheckpointError` line:
a bad id, a repository or revision that does not exist, a gated repository (set
``HF_TOKEN``, accept its terms), nothing cached while offline, no weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from model_export.model_files import sha256_file
from model_export.st_folder import CheckpointError, modules

# Files at a checkpoint's root the export may read (hf_import, st_folder, heads and the
# slow tokenizer's conversion, tokenizer_convert): no wildcard, so no copy of the model
# in a sub-folder of the repository is fetched.
ROOT_FILES: Final = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "sentencepiece.model",
    "spiece.model",
    "spm.model",
    "tokenizer.model",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    # late interaction (model_export.late_interaction): Stanford ColBERT's, bge-m3's
    "artifact.metadata",
    "colbert_linear.pt",
    "sparse_linear.pt",
)
SAFETENSORS: Final = "model.safetensors"
PICKLED: Final = "pytorch_model.bin"  # read only where a folder has no SAFETENSORS
DEFAULT_POOLING: Final = "1_Pooling"  # read without a modules.json naming it

# owner/name or a bare legacy name (bert-base-uncased), then an optional @revision
# (refs/pr/1 has slashes); huggingface_hub validates the id itself.
HUB_SPEC: Final = re.compile(r"(?P<repo>[\w][\w.-]*(?:/[\w.-]+)?)(?:@(?P<revision>[\w./-]+))?")


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """Where a checkpoint's files are, and what they were resolved from."""

    path: Path  # the folder to read: the directory, or the Hub cache's snapshot
    name: str  # the default model name: the directory's or the repository's last part
    repo_id: str | None = None  # None: a local directory
    revision: str | None = None  # as asked (None: the default branch)
    commit: str | None = None  # the commit the revision resolved to
    files: dict[str, str] = field(default_factory=dict)  # relative name -> SHA-256

    def provenance(self) -> dict[str, Any]:
        """What the manifest's ``record`` keeps of where the checkpoint came from."""
        if self.repo_id is None:
            return {"directory": str(self.path), "files": self.files}
        return {
            "hub": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "files": self.files,
        }


def read_files(root: Path) -> list[str]:
    """The files under ``root`` the export reads, relative: the root's (ROOT_FILES and
    its weights) and each sentence-transformers module folder's."""
    names = list(ROOT_FILES)
    folders = {"", DEFAULT_POOLING} | {_relative(root, path) for _, path in modules(root)}
    for folder in sorted(folders):
        prefix = f"{folder}/" if folder else ""
        names += [f"{prefix}config.json"] if folder else []
        names.append(prefix + (SAFETENSORS if (root / prefix / SAFETENSORS).is_file() else PICKLED))
    return sorted(name for name in set(names) if (root / name).is_file())


def file_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of each file the export reads (read_files)."""
    return {name: sha256_file(root / name) for name in read_files(root)}


def _relative(root: Path, path: Path) -> str:
    """A module folder (st_folder.modules: resolved) relative to ``root``; "" for the root."""
    relative = path.relative_to(root.resolve()).as_posix()
    return "" if relative == "." else relative


def resolve_checkpoint(spec: str | Path) -> ResolvedCheckpoint:
    """A directory, else a Hub id (``org/name[@revision]``) fetched through the
    Hugging Face cache; CheckpointError (one line) when it is neither."""
    path = Path(spec)
    if path.is_dir():
        return ResolvedCheckpoint(path, path.resolve().name, files=file_hashes(path))
    text = str(spec)
    match = HUB_SPEC.fullmatch(text)
    if isinstance(spec, Path) or match is None or text.startswith((".", "~")):
        raise CheckpointError(f"checkpoint directory {text} not found")
    repo, revision = match["repo"], match["revision"]
    if revision is not None and {"", ".", ".."} & set(revision.split("/")):
        # huggingface_hub reads refs/<revision> in its cache: a revision stays a name there
        raise CheckpointError(f"{text}: {revision!r} is not a revision (a branch, tag or commit)")
    folder = _fetch(
        text, repo, revision, [*ROOT_FILES, SAFETENSORS, f"{DEFAULT_POOLING}/config.json"]
    )
    commit = folder.name  # the cache's layout: snapshots/<commit>
    label = f"{repo}@{commit}"
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{label} has no config.json: not a transformers checkpoint")
    # The module folders sentence-transformers' modules.json names, at the same commit.
    found = [(kind, _relative(folder, path)) for kind, path in modules(folder)]
    wanted = [f"{f}/{name}" for _, f in found if f for name in ("config.json", SAFETENSORS)]
    if wanted:
        _fetch(text, repo, commit, wanted)
    # Pickled weights only where a folder with weights (the root, a Dense module's) has
    # no safetensors: never both.
    weighted = ["", *(f for kind, f in found if kind == "Dense" and f)]
    pickled = [
        f"{f}/{PICKLED}".lstrip("/") for f in weighted if not (folder / f / SAFETENSORS).is_file()
    ]
    if pickled:
        _fetch(text, repo, commit, pickled)
    if not (folder / SAFETENSORS).is_file() and not (folder / PICKLED).is_file():
        raise CheckpointError(f"{label} has neither {SAFETENSORS} nor {PICKLED}: no weights")
    return ResolvedCheckpoint(
        folder,
        repo.rsplit("/", 1)[-1],
        repo_id=repo,
        revision=revision,
        commit=commit,
        files=file_hashes(folder),
    )


def _fetch(spec: str, repo: str, revision: str | None, patterns: list[str]) -> Path:
    """``snapshot_download`` of ``patterns``; its errors as one CheckpointError line."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise CheckpointError(
            f"{spec} is not a directory, and a Hub id needs huggingface_hub: "
            "pip install huggingface_hub"
        ) from None
    try:
        # Offline, said outright: huggingface_hub 1.x would list a commit's files online
        # (and fail) even with HF_HUB_OFFLINE set.
        offline = constants.is_offline_mode()
        return Path(
            snapshot_download(
                repo, revision=revision, allow_patterns=patterns, local_files_only=offline
            )
        )
    except GatedRepoError:  # before RepositoryNotFoundError, its base class
        raise CheckpointError(
            f"{repo} is a gated repository: accept its terms on https://huggingface.co/{repo} "
            "and set HF_TOKEN to a token of that account"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{spec} is neither a directory nor a repository on the Hugging Face Hub "
            "(a private one needs HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{repo} has no revision {revision!r}") from None
    except LocalEntryNotFoundError as exc:
        where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
        if constants.is_offline_mode():
            raise CheckpointError(
                f"{spec} is neither a directory nor in {where}, and HF_HUB_OFFLINE is set: "
                "fetch it once online"
            ) from None
        raise CheckpointError(f"{spec}: not in {where}: {first_line(exc)}") from None
    except HFValidationError as exc:
        raise CheckpointError(
            f"{spec} is neither a directory nor a Hub id: {first_line(exc)}"
        ) from None
    except HfHubHTTPError as exc:
        raise CheckpointError(f"{spec}: the Hugging Face Hub answered {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """An exception's first line (its type's name when it says nothing)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
