"""Prometheus metrics: one registry per app, request counts and latency labelled by route template."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Metrics:
    def __init__(self) -> None:
        # A private registry: several apps in one process (tests) never collide on metric names.
        self.registry = CollectorRegistry()
        self.requests = Counter("kb_http_requests_total", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("kb_http_request_duration_seconds", "HTTP request latency", ["method", "route"],
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                 registry=self.registry)
        self.diagnoses = Counter("kb_diagnoses_total", "diagnose calls by outcome", ["outcome"],
                                 registry=self.registry)
        self.ingests = Counter("kb_ingests_total", "ingested documents by status", ["status"],
                               registry=self.registry)
        self.chatops = Counter("kb_chatops_requests_total", "chat-ops requests", ["platform", "outcome"],
                               registry=self.registry)
        self.jobs = Gauge("kb_repro_jobs", "repro jobs of this process", ["status"], registry=self.registry)
        self.records = Gauge("kb_records", "incidents in the knowledge base", registry=self.registry)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            # The template (/v1/incidents/{incident_id}), never the raw path: ids would explode cardinality.
            label = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(method, label, str(status)).inc()
            self.metrics.latency.labels(method, label).observe(time.perf_counter() - start)
