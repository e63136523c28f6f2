"""LLM rerankers: a causal LM asked whether a document meets a query (Qwen3-Reranker).

sentence-transformers (6.x) reads such a folder as a ``CrossEncoder``: a ``*ForCausalLM``
checkpoint whose chat template renders a pair as one prompt (messages of roles
``query`` and ``document``, and ``system`` for the instruction, its ``prompt``), and a
``LogitScore`` module: logit("yes") - logit("no") at the last token, then the
CrossEncoder's activation (sigmoid: the two-way softmax of the model card).

The export renders the template once with sentinel values, splits it into fixed
pieces around the slots (``manifest.PromptTemplate``) and renders it again with other
values to check that the template only places them (a template that transforms its
input is refused); the service then builds each prompt by filling the slots, with
no template engine. Rendered as transformers renders chat templates (a sandboxed
Jinja environment, blocks trimmed), the special tokens' names in scope.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model_export.manifest import LlmReranker, PromptTemplate
from model_export.st_folder import CheckpointError

# The CrossEncoder's default answers (sentence-transformers' convert_tokens_to_ids).
ANSWERS = ("yes", "no")
_SENTINELS = {
    "instruction": "\x00INSTRUCTION\x00",
    "query": "\x00QUERY\x00",
    "document": "\x00DOCUMENT\x00",
}
# Second renders: the template must place these where the sentinels were.
_PROBES = (
    {"instruction": "Find the fox.", "query": "a  fox?", "document": " The quick\nbrown fox. "},
    {"instruction": "x", "query": "{{ q }}", "document": "<Document>: d"},
)
_LOGIT_SCORE = "LogitScore"


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return raw if isinstance(raw, dict) else {}


def _modules(root: Path) -> list[dict[str, Any]]:
    path = root / "modules.json"
    raw = json.loads(path.read_text()) if path.is_file() else []
    return [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []


def _logit_score(root: Path) -> dict[str, Any] | None:
    """The folder's LogitScore module's config, if it has one."""
    for module in _modules(root):
        if str(module.get("type", "")).rsplit(".", 1)[-1] == _LOGIT_SCORE:
            return _json(root / str(module.get("path") or "") / "config.json")
    return None


def is_llm_reranker(root: Path, hf: dict[str, Any]) -> bool:
    """A ``*ForCausalLM`` folder saved as a sentence-transformers CrossEncoder (its
    LogitScore module, or ``model_type`` CrossEncoder); an embedder saved from the same
    architecture (Qwen3-Embedding) is not one."""
    names = [str(a) for a in hf.get("architectures") or []]
    if not any(a.endswith("ForCausalLM") for a in names):
        return False
    st = _json(root / "config_sentence_transformers.json")
    return _logit_score(root) is not None or st.get("model_type") == "CrossEncoder"


def chat_template(root: Path) -> str:
    """The folder's chat template: ``chat_template.jinja``, else tokenizer_config.json's
    (a string, or the one named ``default``)."""
    path = root / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    found = _json(root / "tokenizer_config.json").get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    if not isinstance(found, str):
        raise CheckpointError(
            "an LLM reranker needs a chat template rendering the query and document roles "
            "(chat_template.jinja, as sentence-transformers' CrossEncoder reads it)"
        )
    return found


def _special_tokens(root: Path) -> dict[str, str]:
    """The names a chat template sees beside the messages (bos_token, eos_token, ...)."""
    config = _json(root / "tokenizer_config.json")
    found = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    return found


def _render(template: str, values: dict[str, str], names: dict[str, str]) -> str:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise CheckpointError(f"the chat template refused the probe pair: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    messages = (
        [{"role": "system", "content": values["instruction"]}] if "instruction" in values else []
    )
    messages += [
        {"role": "query", "content": values["query"]},
        {"role": "document", "content": values["document"]},
    ]
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=False, **names
        )
    except jinja2.TemplateError as exc:
        raise CheckpointError(f"the chat template cannot render a pair: {exc}") from exc


def split_template(template: str, names: dict[str, str], instruction: bool) -> PromptTemplate:
    """The template as pieces around slots; refused unless it places each value as
    given, once (checked on the probes)."""
    slots_used = ("instruction", "query", "document") if instruction else ("query", "document")
    rendered = _render(template, {k: _SENTINELS[k] for k in slots_used}, names)
    pieces, slots, rest = [], [], rendered
    while True:
        found = [(rest.find(_SENTINELS[s]), s) for s in slots_used if _SENTINELS[s] in rest]
        if not found:
            break
        at, slot = min(found)
        pieces.append(rest[:at])
        slots.append(slot)
        rest = rest[at + len(_SENTINELS[slot]) :]
    pieces.append(rest)
    missing = [s for s in slots_used if s not in slots]
    if missing:
        raise CheckpointError(
            f"the chat template leaves out the {' and '.join(missing)} it is given: "
            "it cannot carry a query-document pair"
        )
    try:
        split = PromptTemplate(tuple(pieces), tuple(slots))
    except ValueError as exc:
        raise CheckpointError(f"the chat template: {exc}") from exc
    for probe in _PROBES:
        values = {k: v for k, v in probe.items() if k in slots_used}
        if split.render(values)[0] != _render(template, values, names):
            raise CheckpointError(
                "the chat template changes the texts it is given (not only placing them): "
                "not supported"
            )
    return split


def answer_ids(root: Path, tokenizer_file: Path | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The answer tokens and ids: the LogitScore module's (true, false), else the
    tokenizer's "yes" and "no" (what the CrossEncoder takes by default)."""
    from tokenizers import Tokenizer

    tokenizer = None if tokenizer_file is None else Tokenizer.from_file(str(tokenizer_file))
    config = _logit_score(root)
    if config is not None:
        ids = [config.get("true_token_id"), config.get("false_token_id")]
        found = tuple(int(i) for i in ids if i is not None)
        if not found or not all(isinstance(i, int) for i in ids if i is not None):
            raise CheckpointError("LogitScore's config names no true_token_id")
        names = tuple(
            (tokenizer.id_to_token(i) if tokenizer is not None else None) or f"[{i}]" for i in found
        )
        return names, found
    if tokenizer is None:
        raise CheckpointError("an LLM reranker needs its tokenizer to find 'yes' and 'no'")
    pair = [tokenizer.token_to_id(token) for token in ANSWERS]
    if None in pair:
        raise CheckpointError("the tokenizer has no 'yes' and/or 'no' token to score with")
    return ANSWERS, tuple(int(i) for i in pair if i is not None)


def llm_reranker(
    root: Path,
    answers: tuple[tuple[str, ...], tuple[int, ...]],
    prompts: dict[str, str],
    default_prompt_name: str | None,
) -> LlmReranker:
    """What the manifest records of an LLM reranker at ``root``."""
    template = chat_template(root)
    names = _special_tokens(root)
    default = prompts.get(default_prompt_name) if default_prompt_name else None
    return LlmReranker(
        split_template(template, names, instruction=True),
        split_template(template, names, instruction=False),
        answers[0],
        answers[1],
        default or None,
    )
