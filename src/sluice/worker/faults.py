"""Fault injection for a worker — a testing aid, off by default, never for production.

Failover, partial batch failure and automatic rollback are only trustworthy if they are tested,
and killing processes at the right moment from a test is timing-dependent. A worker started with
`--fault-injection SPEC` (or `SLUICE_FAULT_INJECTION`) misbehaves deterministically instead.
SPEC is a comma-separated list of:

    fail_seed=N            a step containing a request with sampling seed N raises in the engine:
                           that request fails alone (FinishReason.ERROR), its batch goes on
    exit_after_tokens=N    the process exits (code 137, like SIGKILL) as soon as it has sent N
                           output tokens in total: a crash mid-stream, at a known point
    fail_all               every generation request fails before any output (UNAVAILABLE):
                           a broken version (the router retries elsewhere; a rollout rolls back)
    delay_first_token_s=S  every request waits S seconds before its first output: a slow version
    step_delay_s=S         every engine step sleeps S seconds first: a slow accelerator, so a
                           stream provably lasts long enough to be interrupted (drain tests)
    load_delay_s=S         the model load waits S seconds first (the worker listens and reports
                           "loading" meanwhile): a slow load, observable however fast the machine

Warm-up requests (worker/warmup.py: sent by the gateway before a worker takes traffic) are
exempt, so a faulty worker still becomes ready and the fault hits real traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.worker.warmup import is_warmup


@dataclass(slots=True, frozen=True)
class FaultSpec:
    fail_seed: int | None = None
    exit_after_tokens: int | None = None
    fail_all: bool = False
    delay_first_token_s: float = 0.0
    step_delay_s: float = 0.0
    load_delay_s: float = 0.0

    @property
    def active(self) -> bool:
        return self != FaultSpec()

    @classmethod
    def parse(cls, spec: str | None) -> "FaultSpec":
        """Raises ValueError naming the bad item."""
        fail_seed: int | None = None
        exit_after: int | None = None
        fail_all, delay, step_delay, load_delay = False, 0.0, 0.0, 0.0
        for item in (spec or "").split(","):
            item = item.strip()
            if not item:
                continue
            name, _, raw = item.partition("=")
            try:
                if name == "fail_all" and not raw:
                    fail_all = True
                elif name == "fail_seed" and raw:
                    fail_seed = int(raw)
                elif name == "exit_after_tokens" and raw:
                    exit_after = int(raw)
                elif name == "delay_first_token_s" and raw:
                    delay = float(raw)
                elif name == "step_delay_s" and raw:
                    step_delay = float(raw)
                elif name == "load_delay_s" and raw:
                    load_delay = float(raw)
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"fault injection: {item!r} is not one of fail_seed=N, exit_after_tokens=N, "
                                 "fail_all, delay_first_token_s=S, step_delay_s=S, "
                                 "load_delay_s=S") from None
        return cls(fail_seed, exit_after, fail_all, delay, step_delay, load_delay)

    @staticmethod
    def exempt(request_id: str) -> bool:
        return is_warmup(request_id)
