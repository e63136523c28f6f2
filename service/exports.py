"""``ATTNSERVE_EXPORT_MODELS``: checkpoints named by the operator, exported into the
model repository before the server listens, once, then served.

Each entry is ``[name=]spec``: a checkpoint directory, or a Hugging Face id with an
optional ``@revision`` (resolved by the exporter). The export runs
``python -m model_export --checkpoint=<spec> --out <repository>/<name> --unless-current``
in a subprocess, so torch never enters the server process, and its output goes to
the log line by line. The export directory then holds ``PIN_FILE``: the spec it
came from and its manifest's SHA-256. A later start that finds the pin for the same
spec serves the export as it is (no subprocess, no torch needed); a directory the
pin does not match (another spec, a changed manifest, a directory this did not
write) is refused with one line that says what to remove, never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from types import FrameType

from model_export.manifest import FORMAT_VERSION, Manifest, ManifestError, graph_io
from service.repository import model_dir
from service.settings import Settings

log = logging.getLogger(__name__)

SETTING = "ATTNSERVE_EXPORT_MODELS"
PIN_FILE = "attnserve-export.json"
# What `python -m model_export` imports beyond the serve extra (the `export` extra).
EXPORT_MODULES = ("torch", "onnx", "onnxscript", "safetensors")
EXPORT_EXTRA = "pip install 'attnserve[export]' (torch's CPU build: see the Makefile)"
# A derived name keeps these characters of the spec's last part; others become "-".
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_DERIVED_NAME = 100
STOP_WAIT_SECONDS = 10.0  # a stopped export's exporter: from SIGTERM to SIGKILL


class ExportRefused(Exception):
    """The models cannot be exported or served as named: one line saying why."""


class _Stopped(Exception):
    """SIGTERM arrived during an export."""


@dataclass(frozen=True)
class ExportEntry:
    """One entry of the setting: the model's name and the spec it is exported from."""

    name: str
    spec: str

    @property
    def pinned_spec(self) -> str:
        """What the pin records: a directory's absolute path, else the spec as given."""
        path = Path(self.spec)
        return str(path.resolve()) if path.is_dir() else self.spec


def parse(text: str) -> list[ExportEntry]:
    """The setting's entries, names checked; ExportRefused on any fault."""
    entries: list[ExportEntry] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        head, eq, tail = item.partition("=")
        # Before the first "=": the name (a spec holding "=" is named: name=spec).
        name, spec = (head.strip(), tail.strip()) if eq else (None, item)
        if not spec:
            raise ExportRefused(f"{SETTING}: {item!r} names no checkpoint")
        if spec.startswith(("/", ".")) and not Path(spec).is_dir():
            raise ExportRefused(f"{SETTING}: {spec!r} is not a checkpoint directory")
        entries.append(ExportEntry(_checked_name(name or derive_name(spec), spec), spec))
    names = [e.name for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ExportRefused(
            f"{SETTING}: model name {twice[0]!r} is given twice: name one of them (name=spec)"
        )
    return entries


def derive_name(spec: str) -> str:
    """A model name from a spec: a directory's own name, a Hub id's repository name
    (``BAAI/bge-small-en-v1.5@main`` -> ``bge-small-en-v1.5``), kept to ``[A-Za-z0-9._-]``."""
    path = Path(spec)
    base = path.resolve().name if path.is_dir() else spec.rstrip("/").rpartition("/")[2]
    if not path.is_dir():
        base = base.partition("@")[0]
    name = NAME_UNSAFE.sub("-", base).strip(".-")[:MAX_DERIVED_NAME]
    if not name:
        raise ExportRefused(f"{SETTING}: no model name in {spec!r}: give one as name={spec}")
    return name


def _checked_name(name: str, spec: str) -> str:
    """A model name as the repository allows it (a plain directory name, not hidden)."""
    try:
        model_dir(Path("."), name)
    except ManifestError as exc:
        raise ExportRefused(f"{SETTING}: {spec!r}: {exc}") from None
    return name


def prepare(settings: Settings) -> Settings:
    """Export what the setting names and is not exported yet; the settings to serve with:
    the first entry the default model unless one is set, every entry loaded at start in
    explicit mode."""
    entries = parse(settings.export_models)
    if not entries:
        return settings
    for entry in entries:
        ensure_exported(entry, settings.model_repository)
    update: dict[str, object] = {}
    if settings.default_model is None:
        update["default_model"] = entries[0].name
    if settings.model_control == "explicit":
        listed = [n.strip() for n in settings.load_models.split(",") if n.strip()]
        update["load_models"] = ",".join([*listed, *(e.name for e in entries)])
    return settings.model_copy(update=update)


def ensure_exported(entry: ExportEntry, repository: Path) -> None:
    """``repository/<name>`` holds the export of ``entry``'s spec: found pinned, or
    exported now."""
    out = repository / entry.name
    if out.is_symlink():
        raise ExportRefused(f"{out} is a symbolic link: {SETTING} writes only real directories")
    if out.exists() and _pinned_current(entry, out):
        log.info("model %s: %s holds its pinned export: not exporting", entry.name, out)
        return
    missing = [m for m in EXPORT_MODULES if not _installed(m)]
    if missing:
        raise ExportRefused(
            f"{SETTING}: exporting {entry.spec!r} needs the export extra ({', '.join(missing)} "
            f"not installed): {EXPORT_EXTRA}, or export it where torch is and serve that "
            "model repository"
        )
    _run_export(entry, out)
    _write_pin(entry, out)


def _pinned_current(entry: ExportEntry, out: Path) -> bool:
    """True: ``out`` is this spec's export, in this version's format. False: it is this
    spec's, to export again (unreadable or an older format). ExportRefused: not this
    spec's export, or changed since."""
    pin = _read_pin(out)
    if pin is None:
        raise ExportRefused(
            f"{out} exists and was not written by {SETTING}: remove it, or give the model "
            f"another name ({SETTING}=other-name={entry.spec})"
        )
    if pin.get("spec") != entry.pinned_spec:
        raise ExportRefused(
            f"{out} is pinned to {pin.get('spec')!r}, not {entry.pinned_spec!r}: remove {out} "
            f"to export the new one, or give it another name (name={entry.spec})"
        )
    try:
        manifest = Manifest.read(out)
    except ManifestError as exc:
        log.warning("model %s: exporting again: %s", entry.name, exc)
        return False
    if _config_sha256(out) != pin.get("config_sha256"):
        raise ExportRefused(
            f"{out} changed since it was exported from {entry.spec!r} (its "
            f"{graph_io.CONFIG_FILE} is not the pinned one): remove it to export again"
        )
    if manifest.format_version < FORMAT_VERSION:
        log.warning(
            "model %s: exporting again: format %d, this version writes %d",
            entry.name,
            manifest.format_version,
            FORMAT_VERSION,
        )
        return False
    return True


def _read_pin(out: Path) -> dict[str, object] | None:
    try:
        pin = json.loads((out / PIN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return pin if isinstance(pin, dict) else None


def _write_pin(entry: ExportEntry, out: Path) -> None:
    manifest = Manifest.read(out)
    pin = {
        "spec": entry.pinned_spec,
        "config_sha256": _config_sha256(out),
        "weights_source": manifest.record.get("weights_source"),
    }
    (out / PIN_FILE).write_text(json.dumps(pin, indent=2) + "\n", encoding="utf-8")


def _config_sha256(out: Path) -> str:
    return hashlib.sha256((out / graph_io.CONFIG_FILE).read_bytes()).hexdigest()


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (torch stays out)."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _run_export(entry: ExportEntry, out: Path) -> None:
    """``python -m model_export`` in a subprocess, its output logged as it comes; one
    line on failure. SIGTERM or Ctrl-C stops it (its staging directory is removed)."""
    command = [
        sys.executable,
        "-u",  # unbuffered: each line reaches the log as it is printed
        "-m",
        "model_export",
        f"--checkpoint={entry.spec}",
        "--out",
        str(out),
        "--unless-current",
    ]
    log.info("model %s: exporting %r into %s (once)", entry.name, entry.spec, out)
    last = ""
    with (
        _sigterm_stops(),
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip():
                    last = line.rstrip()
                    log.info("export %s: %s", entry.name, last)
            code = proc.wait()
        except (KeyboardInterrupt, _Stopped):
            _stop(proc)
            raise ExportRefused(f"model {entry.name}: the export was stopped") from None
    if code != 0:
        raise ExportRefused(
            f"model {entry.name}: exporting {entry.spec!r} failed (exit {code}): {last}"
        )


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM first: the exporter stops as on Ctrl-C, removing its staging directory
    (SIGINT would be ignored by an exporter of a server started in the background)."""
    proc.terminate()
    try:
        proc.wait(timeout=STOP_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM during the export stops it (before the server runs, nothing else would)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
