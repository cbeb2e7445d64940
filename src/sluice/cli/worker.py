"""`sluice worker`: one engine behind the gRPC service, for `sluice serve --worker ADDR`."""

from __future__ import annotations

import argparse
import sys

from sluice.cli.common import add_engine_args, add_model_args, engine_setting_values

PROGRESS = {"auto": None, "always": True, "never": False}


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _run(args: argparse.Namespace) -> int:
    # A stop request while still importing torch is a clean stop too (exit 0, not 143/130);
    # run_worker replaces these handlers with its own once its event loop runs.
    import signal

    from sluice.openmp_wait import sleep_when_idle

    sleep_when_idle()  # before torch loads (openmp_wait.py)
    signal.signal(signal.SIGTERM, _exit_cleanly)
    signal.signal(signal.SIGINT, _exit_cleanly)
    signal.signal(signal.SIGUSR1, _exit_cleanly)  # a drain before anything runs: nothing to wait for
    import asyncio
    import dataclasses
    import json

    from sluice.config import load_settings
    from sluice.engine.config import EngineConfig
    from sluice.errors import SluiceError
    from sluice.observability.logs import configure as configure_logs
    from sluice.observability.tracing import configure as configure_tracing
    from sluice.worker.faults import FaultSpec

    try:  # the same settings (and defaults) as `sluice serve`, through the one mapping
        settings = load_settings(None, **engine_setting_values(args))
        faults = FaultSpec.parse(args.fault_injection or settings.fault_injection)
        configure_logs(settings.log_level, settings.log_format)
        configure_tracing(settings.trace_exporter, "sluice-worker", settings.otlp_endpoint, settings.trace_file)
        config = EngineConfig.from_settings(settings)
        if args.engine_config:  # every EngineConfig field at once (how `sluice serve` starts its workers)
            config = EngineConfig(**{**dataclasses.asdict(config), **json.loads(args.engine_config)})
        from sluice.models.device import resolve_device

        resolve_device(config.device)  # a CUDA device that is not there: one line and exit 2, before listening
    except (SluiceError, ValueError, TypeError) as exc:  # TypeError: an unknown --engine-config field
        print(f"sluice worker: error: {exc}", file=sys.stderr)
        return 2
    from sluice.thread_name import name_this_thread
    from sluice.worker.worker_main import run_worker

    name_this_thread("sluice-worker")  # the process's name in ps and top: the main thread's
    return asyncio.run(
        run_worker(args.listen, args.model, args.dtype, config, progress=PROGRESS[args.progress], faults=faults)
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="run one engine as a gRPC worker (for `sluice serve --worker ADDR`)",
        description="Run one engine behind the gRPC service. Signals: SIGTERM/SIGINT stop at once (open streams "
        "get a final abort event); SIGUSR1 drains (health NOT_SERVING, new requests refused, running ones "
        "finish, then exit 0). Health: the standard grpc.health.v1 service, '' = taking requests, "
        "'liveness' = alive.",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:50051",
        metavar="ADDR",
        help="host:port or unix:/path to listen on (default: %(default)s)",
    )
    # `sluice serve` pipes its child's stderr (to keep a tail for error messages) yet wants the
    # load bar on the user's terminal: it passes --progress always when its own stderr is one.
    p.add_argument(
        "--progress",
        choices=list(PROGRESS),
        default="auto",
        help="model load progress bar; auto = on a terminal (default: %(default)s)",
    )
    p.add_argument(
        "--engine-config",
        default=None,
        metavar="JSON",
        help="EngineConfig fields as a JSON object, over the flags below (how `sluice serve` starts its workers)",
    )
    p.add_argument(
        "--fault-injection",
        default=None,
        metavar="SPEC",
        help="TESTING AID, never for production: fail_seed=N, exit_after_tokens=N, fail_all, delay_first_token_s=S, "
        "step_delay_s=S, load_delay_s=S "
        "(comma-separated; env SLUICE_FAULT_INJECTION; see docs/FLEET.md)",
    )
    add_model_args(p)
    add_engine_args(p)
    p.set_defaults(func=_run)
