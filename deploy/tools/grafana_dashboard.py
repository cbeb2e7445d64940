"""The sluice Grafana dashboard, built with Grafana's own grafana-foundation-sdk.

One dashboard, rows top to bottom in the order an operator asks: is it up and fast (SLOs,
latency), how much is it doing (throughput, errors), is it keeping up (queue, KV, batches),
and what is the fleet doing about it (scaling signal against the policy's thresholds, workers
by state, the warm pool, versions). The scaling thresholds come from `ScalingSettings`.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders.common import GraphThresholdsStyleConfig, VizLegendOptions, VizTooltipOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard as DashboardBuilder
from grafana_foundation_sdk.builders.dashboard import DatasourceVariable, Row, ThresholdsConfig
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    GraphTresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode

from sluice.routing.fleet_file.scaling_settings import ScalingSettings

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
_REFS = "ABCDEFGH"


def _queries(panel: Any, queries: list[tuple[str, str]]) -> Any:
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(Dataquery().expr(expr).legend_format(legend).ref_id(_REFS[i]))
    return panel


def _series(title: str, unit: str, queries: list[tuple[str, str]], description: str, span: int = 12) -> Timeseries:
    p = (
        Timeseries()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DS)
        .height(8)
        .span(span)
        .legend(
            VizLegendOptions().display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM).show_legend(True)
        )
        .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING))
    )
    return _queries(p, queries)


def _stat(title: str, unit: str, expr: str, description: str) -> Stat:
    return _queries(
        Stat().title(title).description(description).unit(unit).datasource(DS).height(4).span(4), [(expr, title)]
    )


def _quantiles(metric: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le{', ' + by if by else ''}"
    legend = f"{{{{{by}}}}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[$__rate_interval])))",
            f"{legend}p{int(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


def build(settings: ScalingSettings | None = None) -> dict[str, Any]:
    s = settings or ScalingSettings()
    signal_thresholds = (
        ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps(
            [
                Threshold(None, "blue"),
                Threshold(s.scale_down_at, "green"),
                Threshold(s.scale_up_at, "orange"),
                Threshold(1.0, "red"),
            ]
        )
    )
    d = (
        DashboardBuilder("sluice")
        .uid("sluice-overview")
        .description("sluice gateways and workers: SLOs, latency, throughput, queue, KV, fleet and autoscaling")
        .tags(["sluice", "llm-serving"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        # -- overview ---------------------------------------------------------------------------
        .with_row(Row("Service level"))
        .with_panel(
            _stat(
                "Availability (1 h)",
                "percentunit",
                "1 - sluice:slo_availability_errors:ratio_rate1h",
                "Share of /v1 responses that were not 5xx/529 over the last hour (SLO 99.9 %)",
            )
        )
        .with_panel(
            _stat(
                "TTFT under 200 ms (1 h)",
                "percentunit",
                "1 - sluice:slo_ttft_errors:ratio_rate1h",
                "Share of generations whose first token came within 200 ms (SLO 95 %)",
            )
        )
        .with_panel(
            _stat(
                "Scaling signal",
                "none",
                "max(sluice:scaling_signal)",
                "The busiest model's Σ estimated tokens queued + in flight / its workers' capacity; "
                f"up above {s.scale_up_at}, down below {s.scale_down_at}",
            )
        )
        .with_panel(
            _series(
                "Error-budget burn rate",
                "none",
                [
                    ("sluice:slo_availability_errors:ratio_rate1h / 0.001", "availability 1h"),
                    ("sluice:slo_availability_errors:ratio_rate5m / 0.001", "availability 5m"),
                    ("sluice:slo_ttft_errors:ratio_rate1h / 0.05", "ttft 1h"),
                    ("sluice:slo_ttft_errors:ratio_rate5m / 0.05", "ttft 5m"),
                ],
                "Budget spent per unit of time; 1 = exactly on budget, 14.4 over 1 h and 5 m pages",
            )
        )
        # -- latency ----------------------------------------------------------------------------
        .with_row(Row("Latency"))
        .with_panel(
            _series(
                "Time to first token",
                "s",
                _quantiles("sluice_time_to_first_token_seconds"),
                "TTFT quantiles over all routes",
                span=12,
            )
        )
        .with_panel(
            _series(
                "Inter-token latency",
                "s",
                _quantiles("sluice_inter_token_latency_seconds"),
                "Time between output tokens (50 tok/s ≈ 20 ms)",
                span=12,
            )
        )
        .with_panel(
            _series(
                "TTFT p95 by version",
                "s",
                [
                    (
                        "histogram_quantile(0.95, sum by (le, version) "
                        "(rate(sluice_time_to_first_token_seconds_bucket[$__rate_interval])))",
                        "{{version}}",
                    )
                ],
                "Per model version (label version = <model>/<version>)",
                span=24,
            )
        )
        # -- throughput and errors --------------------------------------------------------------
        .with_row(Row("Throughput and errors"))
        .with_panel(
            _series(
                "Requests by status",
                "reqps",
                [
                    (
                        'sum by (status) (rate(sluice_http_requests_total{route=~"/v1/.+"}[$__rate_interval]))',
                        "{{status}}",
                    )
                ],
                "API responses per second by HTTP status (529 = overloaded, 429 = rate limited)",
                span=8,
            )
        )
        .with_panel(
            _series(
                "Output tokens",
                "none",
                [("sum(rate(sluice_output_tokens_total[$__rate_interval]))", "tokens/s")],
                "Generated tokens per second",
                span=8,
            )
        )
        .with_panel(
            _series(
                "Error share",
                "percentunit",
                [
                    (
                        'sum(rate(sluice_http_requests_total{route=~"/v1/.+",status=~"5.."}[$__rate_interval]))'
                        ' / sum(rate(sluice_http_requests_total{route=~"/v1/.+"}[$__rate_interval]))',
                        "5xx + 529",
                    ),
                    (
                        'sum(rate(sluice_http_requests_total{route=~"/v1/.+",status="429"}[$__rate_interval]))'
                        ' / sum(rate(sluice_http_requests_total{route=~"/v1/.+"}[$__rate_interval]))',
                        "429",
                    ),
                ],
                "Failed (5xx, 529) and rate-limited (429) share of API responses",
                span=8,
            )
        )
        .with_panel(
            _series(
                "Requests by version and tier",
                "reqps",
                [
                    (
                        'sum by (version, tier) (rate(sluice_http_requests_total{route=~"/v1/.+"}[$__rate_interval]))',
                        "{{version}} {{tier}}",
                    )
                ],
                "Traffic split across model versions (canary, rollout) and tenant tiers",
                span=24,
            )
        )
        # -- queue and engine -------------------------------------------------------------------
        .with_row(Row("Queue and engine"))
        .with_panel(
            _series(
                "Admission queue depth",
                "none",
                [("sum(sluice_gateway_queue_depth)", "waiting requests")],
                "Requests waiting for admission, all gateways",
                span=8,
            )
        )
        # every gateway reports the same workers, so max over gateways is the version's value
        .with_panel(
            _series(
                "KV cache usage",
                "percentunit",
                [("max by (version) (sluice_engine_kv_usage_ratio)", "{{version}}")],
                "Fraction of KV blocks in use, per model version (its workers combined)",
                span=8,
            )
        )
        .with_panel(
            _series(
                "Batch fill and utilisation",
                "percentunit",
                [
                    (
                        "max by (version) (sluice_engine_batch_fill_ratio)",
                        "{{version}} fill (last step tokens / budget)",
                    ),
                    ("max by (version) (sluice_engine_batch_utilization_ratio)", "{{version}} utilisation"),
                ],
                "How full the engines' steps are, per model version",
                span=8,
            )
        )
        .with_panel(
            _series(
                "KV memory resident",
                "bytes",
                [("max by (version) (sluice_engine_kv_resident_bytes)", "{{version}}")],
                "KV pool memory written at least once, per model version; "
                "falls to the held blocks once an engine rests",
                span=12,
            )
        )
        .with_panel(
            _series(
                "Prefix cache spill file",
                "none",
                [
                    ("max by (version) (sluice_engine_kv_spilled_blocks)", "{{version}} blocks in the file"),
                    (
                        "max by (version) (rate(sluice_engine_kv_spill_restored_blocks_total[$__rate_interval]))",
                        "{{version}} blocks read back / s",
                    ),
                ],
                "The prefix cache kept on disk while engines rest, and how often prefix hits read it back",
                span=12,
            )
        )
        # -- fleet and autoscaling --------------------------------------------------------------
        .with_row(Row("Fleet and autoscaling"))
        .with_panel(
            _series(
                "Scaling signal",
                "none",
                [("sluice:scaling_signal", "{{model}}")],
                "The autoscaler's input, per model (each model's workers scale on their own); thresholds "
                f"from ScalingSettings (up {s.scale_up_at}, down {s.scale_down_at})",
                span=8,
            )
            .thresholds(signal_thresholds)
            .thresholds_style(GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.DASHED))
        )
        .with_panel(
            _series(
                "Workers by state",
                "none",
                [("sum by (state) (sluice_workers)", "{{state}}")],
                "serving | warm | starting | draining | ejected",
                span=8,
            )
        )
        .with_panel(
            _series(
                "Warm pool",
                "none",
                [("sum by (model) (sluice_warm_pool_workers)", "{{model}}")],
                "Loaded workers held back for bursts, per model",
                span=8,
            )
        )
        .with_panel(
            _series(
                "Serving workers by version",
                "none",
                [('sum by (version) (sluice_workers{state="warm"})', "{{version}}")],
                "Which versions take traffic (hot swaps, rollouts)",
                span=24,
            )
        )
    )
    return _numbered(json.loads(JSONEncoder(sort_keys=True, indent=2).encode(d.build())))


def _numbered(dashboard: dict[str, Any]) -> dict[str, Any]:
    """Give every panel a stable, unique id (Grafana links and alerts refer to them)."""
    for i, panel in enumerate(dashboard["panels"], start=1):
        panel["id"] = i
    return dashboard


def render(settings: ScalingSettings | None = None) -> str:
    return json.dumps(build(settings), indent=2, sort_keys=True) + "\n"
