"""Prometheus metrics for ``localspec serve --metrics`` (as llama-server's ``--metrics``).

Each app has its own CollectorRegistry, so that several apps can run in one process. Requests
are counted as their response starts (the status is then known); a generation's tokens as it
ends, in the worker thread, before its answer's last bytes are sent.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from .worker import Job, Outcome

DRAFT_SOURCES = ("eagle", "mtp", "ngram")  # shown at 0 before they draft
# time to first token, queueing included: a short prompt on a GPU to a long one on a CPU
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    """The server's counters, gauges and histogram, in a registry of their own."""

    def __init__(self, queued: Callable[[], int], busy: Callable[[], bool]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "localspec_requests",
            "HTTP requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "localspec_prompt_tokens",
            "Prompt tokens of the generations (cached ones included)",
            registry=r,
        )
        self.completion_tokens = Counter(
            "localspec_completion_tokens", "Tokens generated", registry=r
        )
        self.steps = Counter(
            "localspec_decode_steps", "Target verify decodes (one per speculative step)", registry=r
        )
        self.draft_steps = Counter(
            "localspec_draft_steps",
            "Speculative steps each draft source drafted in",
            ["source"],
            registry=r,
        )
        self.drafted = Counter(
            "localspec_draft_tokens",
            "Draft tokens proposed, by draft source (one both proposed counts for both)",
            ["source"],
            registry=r,
        )
        self.accepted = Counter(
            "localspec_draft_accepted_tokens",
            "Draft tokens accepted, by draft source",
            ["source"],
            registry=r,
        )
        for source in DRAFT_SOURCES:
            for counter in (self.draft_steps, self.drafted, self.accepted):
                counter.labels(source)
        queue = Gauge("localspec_queue_depth", "Requests waiting while one generates", registry=r)
        queue.set_function(lambda: queued())
        running = Gauge("localspec_requests_running", "Generations running (0 or 1)", registry=r)
        running.set_function(lambda: float(busy()))
        self.ttft = Histogram(
            "localspec_time_to_first_token_seconds",
            "Seconds from a request's submission to its first token, queueing included",
            buckets=TTFT_BUCKETS,
            registry=r,
        )

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def generation(self, job: Job, out: Outcome) -> None:
        """A generation has ended (Worker's on_done: in the worker thread)."""
        s = out.stats
        self.prompt_tokens.inc(s.prompt_tokens)
        self.completion_tokens.inc(s.generated)
        self.steps.inc(s.steps)
        for name, src in s.sources.items():
            self.draft_steps.labels(name).inc(src.steps)
            self.drafted.labels(name).inc(src.drafted)
            self.accepted.labels(name).inc(src.accepted)
        if job.ttft is not None:
            self.ttft.observe(job.ttft)

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The body and its content type, in the format the scraper's Accept header asks."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
