"""Prometheus rules for sluice: SLO recording rules, multi-window multi-burn-rate alerts, and
the scaling signal, generated so the seven windows × two SLOs cannot drift apart by hand.

SLOs (over all gateway replicas):
- availability 99.9 %: a bad event is an API response (route /v1/…) with status 5xx — 529
  `overloaded_error` included; 4xx (the caller's mistake, or its own rate limit) is not.
- TTFT: 95 % of generations give their first token within 200 ms (histogram bucket le="0.2").

Alerts follow the Google SRE workbook's multi-window, multi-burn-rate recipe: each alert needs
a long window (is a real share of the budget gone?) AND a short one (is it still burning, so
the alert resolves soon after a fix) over the same burn rate, plus a minimum number of events
in the long window, so a handful of failures at night does not page anyone:
  page:   1 h & 5 m at 14.4× (2 % of a 30-day budget gone), 6 h & 30 m at 6× (5 %)
  ticket: 1 d & 2 h at 3× (10 %), 3 d & 6 h at 1× (10 %)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
_SECONDS = {"5m": 300, "30m": 1800, "1h": 3600, "2h": 7200, "6h": 21600, "1d": 86400, "3d": 259200}


@dataclass(slots=True, frozen=True)
class BurnAlert:
    severity: str  # page | ticket
    long: str
    short: str
    burn: float


BURN_ALERTS = (
    BurnAlert("page", "1h", "5m", 14.4),
    BurnAlert("page", "6h", "30m", 6.0),
    BurnAlert("ticket", "1d", "2h", 3.0),
    BurnAlert("ticket", "3d", "6h", 1.0),
)
# the short windows already make an alert stop soon after a fix; `for` only rides out a single
# evaluation's blip (a scrape lost during a rollout)
FOR = {"page": "2m", "ticket": "15m"}
MIN_EVENTS = 100  # fewer requests than this in the long window never alert


@dataclass(slots=True, frozen=True)
class Slo:
    name: str
    objective: float  # the good share promised
    title: str
    bad_rate: str  # PromQL: bad events per second over the window `$w`
    total_rate: str  # PromQL: all events per second over the window `$w`

    def bad(self, w: str) -> str:
        return self.bad_rate.replace("$w", w)

    def total(self, w: str) -> str:
        return self.total_rate.replace("$w", w)

    @property
    def budget(self) -> float:
        return round(1.0 - self.objective, 10)

    def ratio_record(self, w: str) -> str:
        return f"sluice:slo_{self.name}_errors:ratio_rate{w}"

    def total_record(self, w: str) -> str:
        return f"sluice:slo_{self.name}_requests:rate{w}"


API = 'route=~"/v1/.+"'
SLOS = (
    Slo(
        "availability",
        0.999,
        "Availability 99.9 % (5xx and 529 are bad)",
        f'sum(rate(sluice_http_requests_total{{{API},status=~"5.."}}[$w]))',
        f"sum(rate(sluice_http_requests_total{{{API}}}[$w]))",
    ),
    Slo(
        "ttft",
        0.95,
        "95 % of first tokens within 200 ms",
        # slow = all − those within 0.2 s (the bucket is cumulative)
        "(sum(rate(sluice_time_to_first_token_seconds_count[$w]))"
        ' - sum(rate(sluice_time_to_first_token_seconds_bucket{le="0.2"}[$w])))',
        "sum(rate(sluice_time_to_first_token_seconds_count[$w]))",
    ),
)


def rule_groups() -> dict[str, Any]:
    # One group per SLO, its recording rules first: Prometheus evaluates the rules of a group in
    # order but groups concurrently, so alerts in a group of their own could read the recorded
    # ratios of this evaluation or of the previous one (promtool's tests saw both).
    groups = [_scaling_group()]
    for slo in SLOS:
        groups.append({"name": f"sluice-slo-{slo.name}", "rules": _recording_rules(slo) + _alert_rules(slo)})
    return {"groups": groups}


def _recording_rules(slo: Slo) -> list[dict[str, Any]]:
    rules = []
    for w in WINDOWS:
        rules.append({"record": slo.ratio_record(w), "expr": f"{slo.bad(w)}\n/\n{slo.total(w)}"})
    for w in sorted({a.long for a in BURN_ALERTS}, key=lambda w: _SECONDS[w]):
        rules.append({"record": slo.total_record(w), "expr": slo.total(w)})
    return rules  # evaluated at the global evaluation_interval


def _alert_rules(slo: Slo) -> list[dict[str, Any]]:
    rules = []
    for severity in ("page", "ticket"):
        terms = []
        for a in (a for a in BURN_ALERTS if a.severity == severity):
            limit = _num(a.burn * slo.budget)
            terms.append(
                f"(\n  {slo.ratio_record(a.long)} > {limit}\n"
                f"  and {slo.ratio_record(a.short)} > {limit}\n"
                f"  and {slo.total_record(a.long)} * {_SECONDS[a.long]} >= {MIN_EVENTS}\n)"
            )
        speed = "Fast" if severity == "page" else "Slow"
        rules.append(
            {
                "alert": f"Sluice{slo.name.capitalize()}BudgetBurn{speed}",
                "expr": "\nor\n".join(terms),
                "for": FOR[severity],
                "labels": {"severity": severity, "slo": slo.name},
                "annotations": {
                    "summary": f"sluice SLO '{slo.title}' is burning its error budget ({speed.lower()})",
                    "description": (
                        f"Bad share over the long window: {{{{ $value | humanizePercentage }}}} "
                        f"(budget {_num(slo.budget * 100)} %). See docs/DEPLOY.md, 'Alerts'."
                    ),
                },
            }
        )
    return rules


def _scaling_group() -> dict[str, Any]:
    return {
        "name": "sluice-scaling",
        "interval": "15s",
        "rules": [
            {
                # KEDA's input, per model (sum(sluice:scaling_signal{model="…"}): each worker
                # Deployment scales on its own model). Each gateway divides its own queued +
                # in-flight tokens by the capacity of the model's whole pool, so a model's signal
                # is the sum over the gateways.
                "record": "sluice:scaling_signal",
                "expr": "sum by (model) (sluice_scaling_signal)",
            },
            {
                # per model: one saturated model is not hidden by an idle one, nor summed with it
                "alert": "SluiceWorkersSaturated",
                "expr": "sluice:scaling_signal > 1",
                "for": "15m",
                "labels": {"severity": "ticket"},
                "annotations": {
                    "summary": (
                        "Demand for model {{ $labels.model }} has exceeded its workers' token capacity for 15 minutes"
                    ),
                    "description": (
                        "Scaling signal {{ $value | humanize }} (1 = every worker of the model full). "
                        "Its autoscaler is "
                        "at its maximum or cannot start workers: raise max_workers or add nodes."
                    ),
                },
            },
        ],
    }


def _num(x: float) -> str:
    return f"{x:.6f}".rstrip("0").rstrip(".")
