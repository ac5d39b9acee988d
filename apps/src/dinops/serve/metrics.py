"""Prometheus metrics, one registry per app (two apps in one test process never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dino_http_requests",
            "HTTP requests by endpoint, method and status",
            ["endpoint", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "dino_http_request_duration_seconds", "request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram("dino_batch_size", "images per forward pass", buckets=BATCH_BUCKETS, registry=r)
        self.inference = Histogram(
            "dino_inference_duration_seconds",
            "duration of one batched forward pass",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "dino_queue_wait_seconds", "time an image waited for its batch", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("dino_queue_depth", "images waiting for the model", registry=r)
        self.rejected = Counter("dino_queue_rejections", "requests refused because the queue was full", registry=r)
        self.ready = Gauge("dino_model_ready", "1 when the model is loaded and warmed up", registry=r)
        self.model_state = Gauge(
            "dino_model_state",
            "1 for the model's current state: waiting, loading, ready or failed",
            ["state"],
            registry=r,
        )
        self.reloads = Counter(
            "dino_model_reloads",
            "checkpoint reloads (DINO_RELOAD) by result: ok (swapped in) or failed (the loaded model stays)",
            ["result"],
            registry=r,
        )

    def observe_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.inference.observe(seconds)
