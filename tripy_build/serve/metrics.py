"""``GET /metrics``: the server's counters in Prometheus' text format (``prometheus-client``).

The per-model numbers are read from each batcher's ``Stats`` when scraped, the same counters that
``/v2/models/stats`` reports, so the two never disagree; the HTTP answers by status are counted here.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    """The server's Prometheus registry: per-model counters from ``endpoints``, HTTP answers by status."""

    def __init__(self, endpoints: dict[str, Any]):
        self.endpoints = endpoints
        self.responses: Counter[int] = Counter()
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def response(self, status: int) -> None:
        with self._lock:
            self.responses[status] += 1

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def collect(self) -> Iterable[Any]:
        """The metric families, read now (prometheus-client's collector interface)."""
        label = ["model"]
        requests = CounterMetricFamily("tripy_build_requests", "Inference requests answered", labels=["model", "outcome"])
        rows = CounterMetricFamily("tripy_build_inferences", "Rows inferred (Triton's inference_count)", labels=label)
        calls = CounterMetricFamily("tripy_build_executions", "Calls of the model (Triton's execution_count)", labels=label)
        queue = CounterMetricFamily("tripy_build_queue_seconds", "Time requests waited for their batch", labels=label)
        compute = CounterMetricFamily("tripy_build_compute_seconds", "Time the model's calls ran", labels=label)
        sizes = CounterMetricFamily("tripy_build_batch_executions", "Calls by rows in the call", labels=["model", "batch_size"])
        waiting = GaugeMetricFamily("tripy_build_queued_requests", "Requests waiting for a batch now", labels=label)
        for name, ep in self.endpoints.items():
            s = ep.batcher.stats
            with s.lock:
                requests.add_metric([name, "success"], s.requests - s.failed)
                requests.add_metric([name, "failure"], s.failed)
                rows.add_metric([name], s.rows)
                calls.add_metric([name], s.calls)
                queue.add_metric([name], s.queue_ns / 1e9)
                compute.add_metric([name], s.compute_ns / 1e9)
                for size, (count, _) in sorted(s.batches.items()):
                    sizes.add_metric([name, str(size)], count)
            waiting.add_metric([name], ep.batcher.queued())
        http = CounterMetricFamily("tripy_build_http_responses", "HTTP answers by status", labels=["status"])
        with self._lock:
            for status, count in sorted(self.responses.items()):
                http.add_metric([str(status)], count)
        return [requests, rows, calls, queue, compute, sizes, waiting, http]
