"""Prometheus metrics for the serving path (one registry per app, so tests can run several).

Latency histograms use buckets around the product targets (TTFT 200 ms, 50 tok/s ≈ 20 ms
inter-token). Engine gauges are refreshed from the engines' stats at scrape time, so a scrape
always shows the engines as they are, not as they were at the last request. Fleet-wide gauges
carry bounded labels only: model, version (`<model>/<version>`), state — never a worker, key or
tenant, so the series count follows the fleet file, not the traffic.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from sluice.engine.stats import EngineStats
from sluice.observability.families import VERSION, Families
from sluice.observability.recent import RecentLatency

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_ITL = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
_DISCONNECT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ServingMetrics:
    def __init__(self) -> None:
        self.recent = RecentLatency()  # the status page's live plot (not exported)
        families = Families()
        self.registry = families.registry
        self._declare_http(families)
        self._declare_gateway(families)
        self._declare_engine(families)
        self._declare_lora(families)
        self.gaie: GaieMetrics | None = None  # enable_gaie(): the names GAIE's endpoint picker reads

    def _declare_http(self, f: Families) -> None:
        """This API process's requests and connections, the safety layers' verdicts, the search tool's calls."""
        self.requests = f.counter(
            "sluice_http_requests",
            "HTTP requests by route, status, model version (<model>/<version>, or none) and tier",
            ("route", "status", "version", "tier"),
        )
        self.ttft = f.histogram(
            "sluice_time_to_first_token_seconds", "Time to first token", _LATENCY, ("route", "version", "tier")
        )
        self.itl = f.histogram("sluice_inter_token_latency_seconds", "Time between output tokens", _ITL)
        self.e2e = f.histogram("sluice_request_duration_seconds", "End-to-end generation time", _LATENCY, ("route",))
        self.queue_time = f.histogram(
            "sluice_queue_time_seconds", "Time from arrival until the engine starts the request", _LATENCY
        )
        self.output_tokens = f.counter("sluice_output_tokens", "Output tokens generated")
        self.prompt_tokens = f.counter("sluice_prompt_tokens", "Prompt tokens received")
        self.aborted = f.counter("sluice_requests_aborted", "Requests aborted (disconnect, timeout, kill)", ("reason",))
        self.disconnect_abort = f.histogram(
            "sluice_disconnect_abort_seconds",
            "Time from a streaming client's connection closing to its generation being cancelled",
            _DISCONNECT,
        )
        self.stalled_readers_cut = f.counter(
            "sluice_stalled_readers_cut", "Connections aborted because the peer acknowledged nothing for send_timeout_s"
        )
        self.read_refused = f.counter(
            "sluice_http_read_refused",
            "Requests refused while being read (408 slow headers/body, 431 headers too large, 503 too many incomplete)",
            ("status",),
        )
        self.inflight = f.gauge("sluice_http_inflight_generations", "Generations open on this API process")
        self.gc_frozen = f.gauge(
            "sluice_gc_frozen_objects",
            "Objects this API process had built when ready, moved out of the cyclic collector's passes (gc.freeze)",
        )
        self.safety_verdicts = f.counter(
            "sluice_safety_verdicts", "Safety verdicts (blocks and kills) by layer and category", ("layer", "category")
        )
        # the Messages API search tool (serving/search_tool/): "ok" or the error result's code
        self.search_tool_calls = f.counter(
            "sluice_search_tool_calls", "Search tool calls run by the gateway, by result", ("result",)
        )

    def _declare_gateway(self, f: Families) -> None:
        """Admission, the queue, and the scaling signal (per model)."""
        self.gateway_requests = f.counter(
            "sluice_gateway_requests",
            "Admitted requests by how they were served (engine, coalesced, cached)",
            ("kind",),
        )
        self.gateway_queue_time = f.histogram(
            "sluice_gateway_queue_time_seconds", "Time waited in the admission queue", _LATENCY
        )
        self.gateway_rejected = f.gauge("sluice_gateway_rejected_total", "Requests refused by the gateway", ("reason",))
        self.queue_depth = f.gauge("sluice_gateway_queue_depth", "Requests waiting for admission")
        self.queued_tokens = f.gauge("sluice_gateway_queued_tokens", "Estimated tokens (prompt + max_tokens) waiting")
        self.inflight_requests = f.gauge("sluice_gateway_inflight_requests", "Requests dispatched to the engine")
        self.scaling_signal = f.gauge(
            "sluice_scaling_signal",
            "Per model: (estimated tokens queued + in flight) / its serving workers' token capacity"
            " (autoscaling input)",
            ("model",),
        )

    def _declare_engine(self, f: Families) -> None:
        """Engine gauges (from EngineStats), per model version: `version` is <model>/<version>,
        as on the request metrics — one series per version the fleet runs, never per worker;
        and the fleet's workers by state. Read at scrape time."""

        def gauge(name: str, doc: str) -> Gauge:
            return f.gauge(name, doc, VERSION)

        self.running = gauge("sluice_engine_running_requests", "Requests running in the engine")
        self.waiting = gauge("sluice_engine_waiting_requests", "Requests waiting in the engine")
        self.kv_usage = gauge("sluice_engine_kv_usage_ratio", "Fraction of KV blocks in use")
        self.kv_used = gauge("sluice_engine_kv_blocks_used", "KV blocks held by requests")
        self.kv_total = gauge("sluice_engine_kv_blocks_total", "Usable KV blocks")
        self.hit_rate = gauge("sluice_engine_prefix_cache_hit_rate", "Prefix-cache hit rate (tokens)")
        self.preemptions = gauge("sluice_engine_preemptions_total", "Preemptions since start")
        self.step_tokens = gauge("sluice_engine_batch_tokens", "Tokens in the last engine step")
        self.batch_fill = gauge("sluice_engine_batch_fill_ratio", "Last step's tokens over the step budget")
        # utilization: the fullest of a step's three limits (docs/ENGINE.md); the mean over any
        # range is rate(sluice_engine_batch_utilization_sum) / rate(sluice_engine_steps_total)
        self.batch_utilization = gauge(
            "sluice_engine_batch_utilization_ratio",
            "Last step's fill of its binding limit: max(tokens/budget, running/max_num_seqs, KV held/usable)",
        )
        self.batch_utilization_sum = gauge(
            "sluice_engine_batch_utilization_sum", "Per-step batch utilization summed over steps since start"
        )
        self.held_steps = gauge(
            "sluice_engine_held_steps_total", "Steps in which the batching window held new arrivals back"
        )
        self.kv_resident = gauge("sluice_engine_kv_resident_bytes", "KV pool memory written at least once")
        self.kv_spilled = gauge("sluice_engine_kv_spilled_blocks", "Prefix-cache blocks kept in the KV spill file")
        self.kv_restored = gauge(
            "sluice_engine_kv_spill_restored_blocks_total",
            "Blocks prefix hits read back from the KV spill file since start",
        )
        self.engine_steps = gauge("sluice_engine_steps_total", "Engine steps since start")
        self.engine_up = gauge("sluice_engine_up", "1 when some worker of the version answered the last stats call")
        # the fleet (read at scrape time)
        self.workers = f.gauge(
            "sluice_workers", "Workers by model, version (<model>/<version>) and state", (*VERSION, "state")
        )
        self.warm_pool = gauge(
            "sluice_warm_pool_workers",
            "Warm-pool workers (loaded, warmed up, no traffic until the autoscaler promotes them)",
        )

    def _declare_lora(self, f: Families) -> None:
        """Per LoRA adapter (its model id; bounded by the fleet, as versions are): requests that
        ended and their tokens, counted by the gateway when each request ends."""
        self.lora_requests = f.counter(
            "sluice_lora_requests",
            "Requests served with a LoRA adapter, by adapter and version (<model>/<version>)",
            ("adapter", "version"),
        )
        self.lora_tokens = f.counter(
            "sluice_lora_tokens",
            "Tokens of requests served with a LoRA adapter, by adapter, version and kind (prompt, output)",
            ("adapter", "version", "kind"),
        )
        self.lora_resident = f.gauge(
            "sluice_engine_lora_resident_adapters", "LoRA adapters resident on the version's workers", VERSION
        )
        self.lora_resident_bytes = f.gauge(
            "sluice_engine_lora_resident_bytes", "Memory of the resident LoRA adapters' weights", VERSION
        )

    def count_lora(self, adapter: str, version: str, prompt_tokens: int, output_tokens: int) -> None:
        self.lora_requests.labels(adapter, version).inc()
        self.lora_tokens.labels(adapter, version, "prompt").inc(prompt_tokens)
        self.lora_tokens.labels(adapter, version, "output").inc(output_tokens)

    def enable_gaie(self) -> None:
        if self.gaie is None:
            self.gaie = GaieMetrics(self.registry)

    def _engine_values(self, s: EngineStats) -> list[tuple[Gauge, float]]:
        return [
            (self.running, s.num_running),
            (self.waiting, s.num_waiting),
            (self.kv_usage, s.kv_usage),
            (self.kv_used, s.kv_blocks_used),
            (self.kv_total, s.kv_blocks_total),
            (self.hit_rate, s.prefix_cache_hit_rate),
            (self.preemptions, s.num_preemptions),
            (self.step_tokens, s.last_step_tokens),
            (self.batch_fill, s.batch_fill),
            (self.batch_utilization, s.last_step_utilization),
            (self.batch_utilization_sum, s.batch_utilization_sum),
            (self.held_steps, s.num_held_steps),
            (self.kv_resident, s.kv_resident_bytes),
            (self.kv_spilled, s.kv_spilled_blocks),
            (self.kv_restored, s.kv_spill_restored_blocks),
            (self.engine_steps, s.num_steps),
        ]

    def observe_engines(self, by_version: dict[tuple[str, str], EngineStats | None]) -> None:
        """(model, <model>/<version>) -> the version's engines combined (engine/stats.py
        `combined`), or None when none of its workers answered (`sluice_engine_up` 0, no other
        series). Versions gone since the last scrape disappear, as in `observe_workers`."""
        for gauge, _ in self._engine_values(EngineStats()):
            gauge.clear()
        self.engine_up.clear()
        self.lora_resident.clear()
        self.lora_resident_bytes.clear()
        for (model, version), s in by_version.items():
            self.engine_up.labels(model, version).set(0 if s is None else 1)
            if s is not None:
                for gauge, value in self._engine_values(s):
                    gauge.labels(model, version).set(value)
                self.lora_resident.labels(model, version).set(len(s.lora_resident))
                self.lora_resident_bytes.labels(model, version).set(s.lora_resident_bytes)

    def observe_workers(self, counts: dict[tuple[str, str, str], int]) -> None:
        """(model, <model>/<version>, state) -> number of workers; combinations gone since the
        last scrape disappear (a retired version is not shown at 0 forever)."""
        self.workers.clear()
        for (model, version, state), n in counts.items():
            self.workers.labels(model, version, state).set(n)

    def observe_warm_pool(self, counts: dict[tuple[str, str], int]) -> None:
        """(model, <model>/<version>) -> STANDBY workers (autoscaled versions always show)."""
        self.warm_pool.clear()
        for (model, version), n in counts.items():
            self.warm_pool.labels(model, version).set(n)

    def observe_gateway(self, gw) -> None:  # gw: sluice.gateway.gateway.Gateway
        q = gw.admission
        self.queue_depth.set(q.depth)
        self.queued_tokens.set(q.queued_tokens)
        self.inflight_requests.set(q.inflight)
        for outcome in ("rate_limited", "overloaded"):  # gateway.Outcome, a str enum (no import up)
            self.gateway_rejected.labels(outcome).set(gw.counts[outcome])

    def observe_scaling(self, signals: dict[str, float]) -> None:
        """model id -> its scaling signal (routing/scaling/signal.py); a model gone since the
        last scrape disappears."""
        self.scaling_signal.clear()
        for model, value in signals.items():
            self.scaling_signal.labels(model).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GaieMetrics:
    """Opt-in (`gaie_metrics`): the series the Gateway API Inference Extension's endpoint picker
    scrapes from a model server, under vLLM's names (its model-server protocol,
    kubernetes-sigs/gateway-api-inference-extension docs/proposals/003-model-server-protocol;
    the picker's default specs read vllm:kv_cache_usage_perc, older copies of the document say
    vllm:gpu_cache_usage_perc). One series each, for this server's engines together, labelled
    with the served base model's id as vLLM labels `model_name`. The colons are vLLM's names;
    Prometheus' linter flags them, and they are what the picker asks for."""

    def __init__(self, r: CollectorRegistry) -> None:
        f, model = Families(r), ("model_name",)
        self.waiting = f.gauge(
            "vllm:num_requests_waiting", "Requests waiting: the admission queue and the engines' queues", model
        )
        self.running = f.gauge("vllm:num_requests_running", "Requests running in the engines", model)
        self.kv_usage = f.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage", model)
        # the value is the time of the last update (the picker takes the newest series)
        self.lora_info = f.gauge(
            "vllm:lora_requests_info",
            "Running stats on LoRA requests",
            ("max_lora", "running_lora_adapters", "waiting_lora_adapters"),
        )

    def observe(self, model_name: str, s: EngineStats, queued: int, now: float) -> None:
        for gauge in (self.waiting, self.running, self.kv_usage, self.lora_info):
            gauge.clear()
        self.waiting.labels(model_name).set(queued + s.num_waiting)
        self.running.labels(model_name).set(s.num_running)
        self.kv_usage.labels(model_name).set(s.kv_usage)
        self.lora_info.labels(str(s.max_loras), ",".join(s.lora_running), ",".join(s.lora_waiting)).set(now)
