"""``Client`` and ``AsyncClient``: the same methods, blocking and awaitable.

Each method runs a flow of :class:`~attnserve_client._base.BaseClient`, where
requests are built, answers read, errors mapped and retries decided; the two
classes differ only in how they send a call and sleep (``_run``) and in how
``encode_many`` keeps several requests in flight (threads vs tasks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Literal, TypeVar

import httpx

from attnserve_client import _constants as C
from attnserve_client._base import (
    BaseClient,
    EncodeOptions,
    Flow,
    Inputs,
    Pooling,
    Reduce,
    SequenceInput,
    WireFormat,
    batches,
    merged_attention_options,
)
from attnserve_client._types import (
    ClassifyResult,
    EncodeResult,
    ModelCard,
    MultiVectorResult,
    RerankResult,
    SimilarityResult,
    SparseResult,
    TokenizeResult,
)

T = TypeVar("T")
Summary = Literal["entropy", "first", "self", "previous", "next", "distance"]


class Client(BaseClient):
    """Blocking client.

    Example::

        import numpy as np
        from attnserve_client import Client

        with Client("http://127.0.0.1:8000") as client:
            result = client.encode(np.random.rand(2, 5, 384).astype("float32"))
            result.stack().shape  # (2, 5, 384)
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = C.DEFAULT_MAX_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries)
        self._http = httpx.Client(transport=transport, **self._http_options())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, flow: Flow[T]) -> T:
        """Send the calls ``flow`` makes, each after its wait; what it returns."""
        try:
            call = next(flow)
            while True:
                if call.wait is not None:
                    time.sleep(call.wait)
                try:
                    response = self._http.request(call.method, call.path, **call.kwargs)
                except httpx.TransportError as exc:
                    call = flow.throw(exc)
                else:
                    call = flow.send(response)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def encode(
        self,
        inputs: Inputs,
        *,
        model: str | None = None,
        return_attention: bool = False,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        reduce: Reduce | None = None,
        pooling: Pooling | None = None,
        normalize: bool = False,
        return_embeddings: bool | None = None,
        truncate: bool = False,
        return_hidden_states: bool = False,
        hidden_layers: Sequence[int] | None = None,
        wire_format: WireFormat | None = None,
        timeout: float | None = None,
        spans: Sequence[Sequence[tuple[int, int]] | None] | None = None,
        embedding_type: Literal["float", "int8", "uint8", "binary", "ubinary"] = "float",
        quantization_ranges: Any = None,
        attention_options: Mapping[str, Any] | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        dtype: Literal["float32", "float16"] | None = None,
        summaries: Sequence[Summary] | None = None,
    ) -> EncodeResult:
        """Contextualized embeddings of ``inputs``: [batch, seq, d] array, or a list of
        [seq_i, d] arrays (ragged) or texts (models with a tokenizer).

        ``wire_format``: None sends arrays as raw float32 over the binary transport
        when the server offers it and the request needs no texts, no selection or
        reduction of attention or hidden states and no truncation, else as base64
        JSON; "binary", "base64" and "float" choose.

        ``spans`` (late chunking): per input, None or the text's character spans
        [(start, end), ...]; with ``pooling`` mean or max, ``span_embeddings[i]`` is
        [n_spans, d_model], each span pooled from the text's one run.

        ``embedding_type``: pooled vectors quantized as sentence-transformers'
        ``quantize_embeddings`` does (int8/uint8 arrays; binary/ubinary packed bits),
        with ``quantization_ranges`` [[mins], [maxes]] or the model's own.

        ``attention_options``: more of the request's ``attention`` object (``top_k``,
        ``threshold``, ``dtype``, ``maps``, ``summaries``, ``summaries_per_token``): the
        result's ``attention_indices`` and ``attention_summaries`` carry what they add.
        ``top_k``, ``threshold``, ``dtype`` and ``summaries`` are its keyword forms (with
        ``return_attention``); one given both ways is a ValueError."""
        options = EncodeOptions(
            model=model,
            return_attention=return_attention,
            layers=layers,
            heads=heads,
            reduce=reduce,
            pooling=pooling,
            normalize=normalize,
            return_embeddings=return_embeddings,
            truncate=truncate,
            return_hidden_states=return_hidden_states,
            hidden_layers=hidden_layers,
            wire_format=wire_format,
            timeout=timeout,
            spans=spans,
            embedding_type=embedding_type,
            quantization_ranges=quantization_ranges,
            attention_options=merged_attention_options(
                attention_options,
                top_k=top_k,
                threshold=threshold,
                dtype=dtype,
                summaries=summaries,
            ),
        )
        return self._run(self._encode(inputs, options))

    def encode_many(
        self,
        sequences: Iterable[SequenceInput],
        *,
        batch_size: int = C.DEFAULT_BATCH_SIZE,
        concurrency: int = C.DEFAULT_CONCURRENCY,
        progress: bool = False,
        **encode_kwargs: Any,
    ) -> EncodeResult:
        """Encode many sequences in requests of ``batch_size``, ``concurrency`` at a time,
        keeping their order."""
        parts, bar = batches(sequences, batch_size, concurrency, progress)
        try:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                futures = [pool.submit(self.encode, b, **encode_kwargs) for b in parts]
                try:
                    for future in as_completed(futures):  # the first failure ends the run
                        done = future.result()
                        if bar is not None:
                            bar.update(len(done))
                except BaseException:
                    pool.shutdown(cancel_futures=True)  # batches not started are not sent
                    raise
        finally:
            if bar is not None:
                bar.close()
        return EncodeResult.concat([f.result() for f in futures])  # in the input's order

    def tokenize(
        self,
        text: str | Sequence[str],
        *,
        model: str | None = None,
        return_embeddings: bool = False,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> TokenizeResult:
        """Tokens, ids and optionally the encoder's input embeddings of ``text``."""
        return self._run(
            self._tokenize(
                text,
                model=model,
                return_embeddings=return_embeddings,
                truncate=truncate,
                timeout=timeout,
            )
        )

    def embed_sparse(
        self,
        texts: str | Sequence[str],
        *,
        kind: Literal["document", "query", "splade"] | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        alpha: float | None = None,
        return_text: bool = False,
        model: str | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> SparseResult:
        """Sparse vectors of ``texts`` (``POST /v1/embed_sparse``): BM42 documents are
        weighted by the model, queries get 1.0 per stem (indices are fastembed's); SPLADE
        models give vocabulary weights (indices are token ids). ``kind`` None: the model's
        own (splade for a SPLADE model, else document); ``top_k`` keeps each vector's
        largest values, ``threshold`` drops those below it."""
        return self._run(
            self._embed_sparse(
                texts,
                model=model,
                kind=kind,
                top_k=top_k,
                threshold=threshold,
                alpha=alpha,
                return_text=return_text,
                truncate=truncate,
                timeout=timeout,
            )
        )

    def multi_vector(
        self,
        texts: str | Sequence[str],
        *,
        input_type: Literal["query", "document"] = "document",
        output: Sequence[Literal["multi_vector", "dense", "sparse"]] = ("multi_vector",),
        embedding_type: Literal["float", "base64"] = "base64",
        dtype: Literal["float32", "float16"] = "float32",
        return_text: bool = False,
        truncate: bool = True,
        prune: dict[str, Any] | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> MultiVectorResult:
        """A vector per token of ``texts`` read as queries or documents
        (``POST /v1/multi-vector``: late interaction, ColBERT and bge-m3), and the dense
        and sparse vectors of the same run where ``output`` asks. Score them with MaxSim,
        or let the server: ``rerank`` on a multi-vector model. ``prune`` (documents):
        ``{"k": 32}`` or ``{"fraction": 0.25}`` keeps the vectors of the tokens receiving
        the most attention, special tokens never."""
        options = _multi_vector_options(
            input_type, output, embedding_type, dtype, return_text, truncate, model
        ) | {"prune": prune}
        return self._run(self._multi_vector(texts, options, timeout))

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        return_documents: bool = False,
        raw_scores: bool = False,
        return_attention: bool = False,
        attention: dict[str, Any] | None = None,
        top_tokens: int | None = None,
        truncate: bool = True,
        instruction: str | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> RerankResult:
        """``documents`` scored against ``query`` by a reranker (``POST /v1/rerank``),
        best first; ``return_attention``: why each ranked (the attention from the query's
        tokens to the document's, selected as ``attention`` selects for ``encode``);
        ``instruction``: an LLM reranker's (default the model's own)."""
        options = {
            "instruction": instruction,
            "model": model,
            "top_n": top_n,
            "return_documents": return_documents,
            "raw_scores": raw_scores,
            "return_attention": return_attention,
            "attention": attention,
            "top_tokens": top_tokens,
            "truncate": truncate,
        }
        return self._run(self._rerank(query, documents, options, timeout))

    def explain_similarity(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        top_pairs: int = 10,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> SimilarityResult:
        """Why ``query`` matches each of ``documents`` (``POST /v1/explain/similarity``,
        mean-pooled models): each served cosine split into token-pair contributions
        ([n_q, n_d] numpy, summing to the score), the ``top_pairs`` largest, and
        per-token totals."""
        options = {"model": model, "top_pairs": top_pairs, "truncate": truncate}
        return self._run(self._explain_similarity(query, documents, options, timeout))

    def classify(
        self,
        inputs: str | Sequence[str | tuple[str, str]],
        *,
        model: str | None = None,
        raw_scores: bool = False,
        top_k: int | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> ClassifyResult:
        """A score per label of each text or (text, text) pair, best first (at most
        ``top_k`` labels), by a classifier (``POST /v1/classify``; ``model`` None: the
        server's default)."""
        options = {"model": model, "raw_scores": raw_scores, "top_k": top_k, "truncate": truncate}
        return self._run(self._classify(inputs, options, timeout))

    def models(self) -> list[ModelCard]:
        return self._run(self._models())

    def model(self, name: str) -> ModelCard:
        return self._run(self._model(name))

    def ready(self) -> bool:
        """True when the server has loaded and warmed up its models (no retries)."""
        return self._run(self._ready())

    def wait_until_ready(self, timeout: float = 60.0, *, interval: float = 0.2) -> None:
        """Poll readiness; APITimeoutError if the server is not ready within ``timeout``."""
        self._run(self._wait_until_ready(timeout, interval))


class AsyncClient(BaseClient):
    """Awaitable twin of :class:`Client`.

    Example::

        async with AsyncClient("http://127.0.0.1:8000") as client:
            result = await client.encode(["A sentence.", "Another one."], pooling="mean")
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = C.DEFAULT_MAX_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries)
        self._http = httpx.AsyncClient(transport=transport, **self._http_options())

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, flow: Flow[T]) -> T:
        """See :meth:`Client._run`."""
        try:
            call = next(flow)
            while True:
                if call.wait is not None:
                    await asyncio.sleep(call.wait)
                try:
                    response = await self._http.request(call.method, call.path, **call.kwargs)
                except httpx.TransportError as exc:
                    call = flow.throw(exc)
                else:
                    call = flow.send(response)
        except StopIteration as stop:
            result: T = stop.value
            return result

    async def encode(
        self,
        inputs: Inputs,
        *,
        model: str | None = None,
        return_attention: bool = False,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        reduce: Reduce | None = None,
        pooling: Pooling | None = None,
        normalize: bool = False,
        return_embeddings: bool | None = None,
        truncate: bool = False,
        return_hidden_states: bool = False,
        hidden_layers: Sequence[int] | None = None,
        wire_format: WireFormat | None = None,
        timeout: float | None = None,
        spans: Sequence[Sequence[tuple[int, int]] | None] | None = None,
        embedding_type: Literal["float", "int8", "uint8", "binary", "ubinary"] = "float",
        quantization_ranges: Any = None,
        attention_options: Mapping[str, Any] | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        dtype: Literal["float32", "float16"] | None = None,
        summaries: Sequence[Summary] | None = None,
    ) -> EncodeResult:
        """See :meth:`Client.encode`."""
        options = EncodeOptions(
            model=model,
            return_attention=return_attention,
            layers=layers,
            heads=heads,
            reduce=reduce,
            pooling=pooling,
            normalize=normalize,
            return_embeddings=return_embeddings,
            truncate=truncate,
            return_hidden_states=return_hidden_states,
            hidden_layers=hidden_layers,
            wire_format=wire_format,
            timeout=timeout,
            spans=spans,
            embedding_type=embedding_type,
            quantization_ranges=quantization_ranges,
            attention_options=merged_attention_options(
                attention_options,
                top_k=top_k,
                threshold=threshold,
                dtype=dtype,
                summaries=summaries,
            ),
        )
        return await self._run(self._encode(inputs, options))

    async def encode_many(
        self,
        sequences: Iterable[SequenceInput],
        *,
        batch_size: int = C.DEFAULT_BATCH_SIZE,
        concurrency: int = C.DEFAULT_CONCURRENCY,
        progress: bool = False,
        **encode_kwargs: Any,
    ) -> EncodeResult:
        """See :meth:`Client.encode_many`."""
        parts, bar = batches(sequences, batch_size, concurrency, progress)
        gate = asyncio.Semaphore(concurrency)

        async def one(batch: list[SequenceInput]) -> EncodeResult:
            async with gate:
                result = await self.encode(batch, **encode_kwargs)
            if bar is not None:
                bar.update(len(result))
            return result

        try:
            # A TaskGroup cancels the other batches as soon as one fails.
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(b)) for b in parts]
        except* Exception as errors:  # callers see the first error, as with Client
            first = errors.exceptions[0]
            raise first from first.__cause__  # e.g. the httpx error under APIConnectionError
        finally:
            if bar is not None:
                bar.close()
        return EncodeResult.concat([t.result() for t in tasks])

    async def tokenize(
        self,
        text: str | Sequence[str],
        *,
        model: str | None = None,
        return_embeddings: bool = False,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> TokenizeResult:
        """See :meth:`Client.tokenize`."""
        return await self._run(
            self._tokenize(
                text,
                model=model,
                return_embeddings=return_embeddings,
                truncate=truncate,
                timeout=timeout,
            )
        )

    async def embed_sparse(
        self,
        texts: str | Sequence[str],
        *,
        kind: Literal["document", "query", "splade"] | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        alpha: float | None = None,
        return_text: bool = False,
        model: str | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> SparseResult:
        """See :meth:`Client.embed_sparse`."""
        return await self._run(
            self._embed_sparse(
                texts,
                model=model,
                kind=kind,
                top_k=top_k,
                threshold=threshold,
                alpha=alpha,
                return_text=return_text,
                truncate=truncate,
                timeout=timeout,
            )
        )

    async def multi_vector(
        self,
        texts: str | Sequence[str],
        *,
        input_type: Literal["query", "document"] = "document",
        output: Sequence[Literal["multi_vector", "dense", "sparse"]] = ("multi_vector",),
        embedding_type: Literal["float", "base64"] = "base64",
        dtype: Literal["float32", "float16"] = "float32",
        return_text: bool = False,
        truncate: bool = True,
        prune: dict[str, Any] | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> MultiVectorResult:
        """See :meth:`Client.multi_vector`."""
        options = _multi_vector_options(
            input_type, output, embedding_type, dtype, return_text, truncate, model
        ) | {"prune": prune}
        return await self._run(self._multi_vector(texts, options, timeout))

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        return_documents: bool = False,
        raw_scores: bool = False,
        return_attention: bool = False,
        attention: dict[str, Any] | None = None,
        top_tokens: int | None = None,
        truncate: bool = True,
        instruction: str | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> RerankResult:
        """``documents`` scored against ``query`` by a reranker (``POST /v1/rerank``),
        best first; ``return_attention``: why each ranked (the attention from the query's
        tokens to the document's, selected as ``attention`` selects for ``encode``);
        ``instruction``: an LLM reranker's (default the model's own)."""
        options = {
            "instruction": instruction,
            "model": model,
            "top_n": top_n,
            "return_documents": return_documents,
            "raw_scores": raw_scores,
            "return_attention": return_attention,
            "attention": attention,
            "top_tokens": top_tokens,
            "truncate": truncate,
        }
        return await self._run(self._rerank(query, documents, options, timeout))

    async def explain_similarity(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        top_pairs: int = 10,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> SimilarityResult:
        """Why ``query`` matches each of ``documents`` (``POST /v1/explain/similarity``,
        mean-pooled models): each served cosine split into token-pair contributions
        ([n_q, n_d] numpy, summing to the score), the ``top_pairs`` largest, and
        per-token totals."""
        options = {"model": model, "top_pairs": top_pairs, "truncate": truncate}
        return await self._run(self._explain_similarity(query, documents, options, timeout))

    async def classify(
        self,
        inputs: str | Sequence[str | tuple[str, str]],
        *,
        model: str | None = None,
        raw_scores: bool = False,
        top_k: int | None = None,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> ClassifyResult:
        """See :meth:`Client.classify`."""
        options = {"model": model, "raw_scores": raw_scores, "top_k": top_k, "truncate": truncate}
        return await self._run(self._classify(inputs, options, timeout))

    async def models(self) -> list[ModelCard]:
        return await self._run(self._models())

    async def model(self, name: str) -> ModelCard:
        return await self._run(self._model(name))

    async def ready(self) -> bool:
        """True when the server has loaded and warmed up its models (no retries)."""
        return await self._run(self._ready())

    async def wait_until_ready(self, timeout: float = 60.0, *, interval: float = 0.2) -> None:
        """Poll readiness; APITimeoutError if the server is not ready within ``timeout``."""
        await self._run(self._wait_until_ready(timeout, interval))


def _multi_vector_options(
    input_type: str,
    output: Sequence[str],
    embedding_type: str,
    dtype: str,
    return_text: bool,
    truncate: bool,
    model: str | None,
) -> dict[str, Any]:
    return {
        "input_type": input_type,
        "output": list(output),
        "embedding_type": embedding_type,
        "dtype": dtype,
        "return_text": return_text,
        "truncate": truncate,
        "model": model,
    }
