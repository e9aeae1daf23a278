"""``GET /metrics``: the server's counters in Prometheus' text format (``prometheus-client``).

The per-model numbers are read from each batcher's ``Stats`` when scraped, the same counters that
``/v2/models/stats`` reports, so the two never disagree; what no batcher sees is counted here: the requests
refused before they reach a model (over HTTP and gRPC), ``/generate``'s requests, the HTTP answers by status
and the connections.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# The model label of a request that names a model not served here: one label for all of them, so that a client
# cannot add a series per name it makes up.
UNKNOWN_MODEL = "(unknown)"
# The last part of an inference route: POST /v2/models/NAME[/versions/V]/infer, /generate, /generate_stream.
INFERENCE_ROUTES = ("infer", "generate", "generate_stream")

REQUESTS_HELP = ("Inference requests (POST .../infer, .../generate, .../generate_stream; gRPC ModelInfer) answered, by "
                 "outcome: success; failure (the model's run failed, or the server did); refused (answered with an "
                 "error before reaching the model: a request the model cannot take (400), an unknown model or version "
                 "(404; an unknown model counts as model=\"(unknown)\"), a method not allowed (405), a body too large "
                 "(413) or of a type not accepted (415), a request too slow (408), unauthorized (401, 403, 421), the "
                 "server busy (503); over gRPC INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, UNIMPLEMENTED, UNAVAILABLE)")


def inference_model(path: str) -> str | None:
    """The model name an inference route's path names, or None for any other path."""
    parts = [p for p in path.split("/") if p]
    if (len(parts) in (4, 6) and parts[:2] == ["v2", "models"] and parts[-1] in INFERENCE_ROUTES
            and (len(parts) == 4 or parts[3] == "versions")):
        return parts[2]
    return None


class Metrics:
    """The server's Prometheus registry: per-model counters from ``endpoints``, and what this counts itself."""

    def __init__(self, endpoints: dict[str, Any]):
        self.endpoints = endpoints
        self.responses: Counter[int] = Counter()
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (model label, outcome) of requests no batcher counted
        self.idle_closed = 0  # idle connections closed to make room for a new one
        self.connections: Callable[[], int] | None = None  # open HTTP connections now (the HTTP server sets it)
        self.max_connections: int | None = None  # their bound (the HTTP server sets it)
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def label(self, model: str | None) -> str:
        """A request's model label: its name where it is served, else ``UNKNOWN_MODEL``."""
        return model if model is not None and model in self.endpoints else UNKNOWN_MODEL

    def response(self, status: int, scope: dict[str, Any] | None = None) -> None:
        """An HTTP answer with ``status`` to the request ``scope`` describes (its ``path``; ``queued`` once a batcher
        or the generator took it), or to none (a connection refused before a request). An error answered on an
        inference route to a request no batcher took counts as that model's refused request (failure for a 5xx
        other than 503)."""
        model = inference_model(scope.get("path") or "") if scope and status >= 400 and not scope.get("queued") else None
        with self._lock:
            self.responses[status] += 1
            if model is not None:
                self.outcomes[(self.label(model), "failure" if status >= 500 and status != 503 else "refused")] += 1

    def outcome(self, model: str | None, outcome: str) -> None:
        """A request to ``model`` that no batcher counts: ``success``, ``failure`` or ``refused``."""
        with self._lock:
            self.outcomes[(self.label(model), outcome)] += 1

    def closed_idle(self) -> None:
        with self._lock:
            self.idle_closed += 1

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def collect(self) -> Iterable[Any]:
        """The metric families, read now (prometheus-client's collector interface)."""
        label = ["model"]
        requests = CounterMetricFamily("tripy_build_requests", REQUESTS_HELP, labels=["model", "outcome"])
        rows = CounterMetricFamily("tripy_build_inferences", "Rows inferred (Triton's inference_count)", labels=label)
        calls = CounterMetricFamily("tripy_build_executions", "Calls of the model (Triton's execution_count)", labels=label)
        queue = CounterMetricFamily("tripy_build_queue_seconds", "Time requests waited for their batch", labels=label)
        compute = CounterMetricFamily("tripy_build_compute_seconds", "Time the model's calls ran", labels=label)
        sizes = CounterMetricFamily("tripy_build_batch_executions", "Calls by rows in the call", labels=["model", "batch_size"])
        waiting = GaugeMetricFamily("tripy_build_queued_requests", "Requests waiting for a batch now", labels=label)
        with self._lock:
            outcomes = dict(self.outcomes)
        for name, ep in self.endpoints.items():
            s = ep.batcher.stats
            with s.lock:
                requests.add_metric([name, "success"], s.requests - s.failed + outcomes.pop((name, "success"), 0))
                requests.add_metric([name, "failure"], s.failed + outcomes.pop((name, "failure"), 0))
                requests.add_metric([name, "refused"], outcomes.pop((name, "refused"), 0))
                rows.add_metric([name], s.rows)
                calls.add_metric([name], s.calls)
                queue.add_metric([name], s.queue_ns / 1e9)
                compute.add_metric([name], s.compute_ns / 1e9)
                for size, (count, _) in sorted(s.batches.items()):
                    sizes.add_metric([name, str(size)], count)
            waiting.add_metric([name], ep.batcher.queued())
        for (name, outcome), count in sorted(outcomes.items()):  # the unknown model's
            requests.add_metric([name, outcome], count)
        http = CounterMetricFamily("tripy_build_http_responses", "HTTP answers by status", labels=["status"])
        with self._lock:
            for status, count in sorted(self.responses.items()):
                http.add_metric([str(status)], count)
            idle = CounterMetricFamily("tripy_build_http_idle_closed", "Idle HTTP connections (no request in flight, "
                                       "nothing buffered) closed, the longest idle first, to make room for a new one "
                                       "at the connection bound", value=self.idle_closed)
        prompts = CounterMetricFamily("tripy_build_prefix_cache_queries", "Prompt tokens admitted to generate "
                                      "(vLLM's prefix_cache_queries)", labels=label)
        hits = CounterMetricFamily("tripy_build_prefix_cache_hits", "Of those, the tokens found in the cache and not "
                                   "run again (vLLM's prefix_cache_hits)", labels=label)
        for name, ep in self.endpoints.items():
            if ep.generator is not None:
                prompts.add_metric([name], ep.generator.prompt_tokens)
                hits.add_metric([name], ep.generator.cached_tokens)
        families = [requests, rows, calls, queue, compute, sizes, waiting, http, idle, prompts, hits]
        if self.connections is not None:
            families.append(GaugeMetricFamily("tripy_build_http_connections", "Open HTTP connections",
                                              value=self.connections()))
        if self.max_connections is not None:
            families.append(GaugeMetricFamily("tripy_build_http_max_connections", "The bound on open HTTP connections "
                                              "(--max-connections)", value=self.max_connections))
        return families
