"""``POST /v1/rerank``: how relevant each document is to a query, by a cross-encoder (a sequence classifier of one
class built with its tokenizer: cross-encoder/ms-marco-MiniLM-L-6-v2, BAAI/bge-reranker-base, mixedbread's and
Alibaba's rerankers), as Jina's and Cohere's rerank APIs take and answer it and vLLM serves it (``/v1/rerank``).

The query and each document are tokenized as one pair (``tokenizer(query, document)``: ``[CLS] query [SEP]
document [SEP]`` with the document's token types 1, where the tokenizer marks them), run in calls of the build's
batch beside ``/infer``'s requests, and scored as the checkpoint's classes are (``metadata.scores``: sigmoid for a
single class, as sentence-transformers' ``CrossEncoder`` and vLLM score; ``none`` where its ``problem_type`` is
``regression``). A pair longer than the build's ``seq`` is refused naming both lengths: never cut.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import CallError

OPTIONS = ("model", "query", "documents", "top_n", "return_documents")


class Rerank:
    """A parsed ``/v1/rerank`` request: the query, its documents' texts, and how the answer lists them."""

    def __init__(self, body: Any):
        if not isinstance(body, dict):
            raise CallError('the request is a JSON object: {"model": NAME, "query": "a question", "documents": '
                            '["a passage", "another"]}.')
        unknown = [k for k in body if k not in OPTIONS]
        if unknown:
            raise CallError(f"{str(unknown[0])[:40]!r} is not an option of /v1/rerank; it takes {', '.join(OPTIONS)}.")
        self.model = body.get("model")
        if not isinstance(self.model, str):
            raise CallError(f'"model" must name a served model, got {str(self.model)[:60]}.')
        self.query = body.get("query")
        if not isinstance(self.query, str) or not self.query:
            raise CallError(f'"query" must be a non-empty text, got {str(self.query)[:60]}.')
        given = body.get("documents")
        texts = ([d["text"] if isinstance(d, dict) and set(d) == {"text"} else d for d in given]
                 if isinstance(given, list) else None)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise CallError('"documents" must be a non-empty list of texts (strings, or {"text": ...} objects), got '
                            f"{str(given)[:80]}.")
        self.documents: list[str] = texts
        self.top_n = body.get("top_n", len(texts))
        if isinstance(self.top_n, bool) or not isinstance(self.top_n, int) or self.top_n < 1:
            raise CallError(f'"top_n" is how many documents to answer with, an integer from 1, got {str(self.top_n)[:40]}.')
        self.return_documents = body.get("return_documents", True)
        if not isinstance(self.return_documents, bool):
            raise CallError(f'"return_documents" must be true or false, got {str(self.return_documents)[:40]}.')

    def answer(self, scores: list[float], tokens: int) -> dict[str, Any]:
        """The answer: the ``top_n`` most relevant documents, highest score first (a tie in the request's order)."""
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:self.top_n]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": self.documents[i]}} if self.return_documents else {})} for i in order]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": self.model, "results": results,
                "usage": {"total_tokens": tokens}}
