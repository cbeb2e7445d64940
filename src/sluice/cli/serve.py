"""`sluice serve`: the HTTP API, with the engine in a worker process (or a remote worker)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice.cli.common import MODEL_FLAGS, add_engine_args, engine_setting_values
from sluice.cli.setting_flags import SettingFlag, add_setting_flags, setting_values
from sluice.config import Settings

_LISTEN_FLAGS = (SettingFlag("host"), SettingFlag("port"), SettingFlag("api_key", "KEY"))
# what is served and by which workers: the model, its name and dtype, a running worker, a fleet
# file, the autoscaler, LoRA adapters (--config, a file of all settings, is no setting itself)
_MODEL_FLAGS = (*MODEL_FLAGS, SettingFlag("served_model_name", "NAME"), SettingFlag("worker", "ADDR"))
_FLEET_FLAGS = (
    SettingFlag("fleet", "FILE"),
    SettingFlag("autoscale", switch=True),
    SettingFlag("lora_modules", "NAME=PATH", nargs="+"),
    SettingFlag("gaie_metrics", switch=True),
)
# how long streams and connections may run (the flags name seconds without the settings' _s), the logs
_STREAM_FLAGS = (
    SettingFlag("ping_interval_s", "S", flag="--ping-interval"),
    SettingFlag("send_timeout_s", "S", flag="--send-timeout"),
    SettingFlag("max_stream_duration_s", "S", flag="--max-stream-duration"),
    SettingFlag("shutdown_grace_s", "S", flag="--shutdown-grace"),
    SettingFlag("log_level"),
    SettingFlag("log_format"),
)
# every flag that sets a setting, but the engine's (common.py)
SETTING_FLAGS = (*_LISTEN_FLAGS, *_MODEL_FLAGS, *_FLEET_FLAGS, *_STREAM_FLAGS)


def _settings_from_args(args: argparse.Namespace):  # -> Settings
    from sluice.config import load_settings

    return load_settings(args.config, **setting_values(args, SETTING_FLAGS), **engine_setting_values(args))


def _run(args: argparse.Namespace) -> int:
    import os

    # serve forks worker children (which exec at once) while its gRPC client runs: gRPC's fork
    # handlers are not needed and would log "Other threads are currently calling into gRPC,
    # skipping fork() handlers" on every restart. Set before grpc is imported.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    # before torch loads (an inline worker's engine runs in this process); workers inherit it
    from sluice.openmp_wait import sleep_when_idle

    sleep_when_idle()

    settings = _settings_from_args(args)
    # the local workers serve spawns trace (and log) the same way: they read these from the env
    for name in ("trace_exporter", "otlp_endpoint", "trace_file", "log_format", "log_level"):
        if getattr(settings, name) is not None:
            os.environ[f"SLUICE_{name.upper()}"] = str(getattr(settings, name))
    _prestart_worker(settings)
    try:
        return _serve(args, settings)
    finally:
        from sluice.worker.spawn import discard_prestarted

        discard_prestarted()  # start-up failed before the fleet took it (or it asked for others)


def _prestart_worker(settings) -> None:  # Settings
    """Start the one local worker of the default fleet now, before this process imports its
    HTTP stack (~1.3 s): the worker's torch import and model load then overlap the gateway's
    start-up on the other core instead of following it. The fleet's first start with the same
    arguments adopts this child (worker/spawn.py); any other case starts workers as before."""
    if settings.worker is not None or settings.fleet:
        return
    if settings.model and not Path(settings.model).expanduser().exists():
        return  # the gateway says so itself, once (the worker would print the same error too)
    from sluice.routing.fleet.replica_launch import local_replica_count, replica_launch
    from sluice.routing.fleet_file.default_fleet import fleet_from_settings
    from sluice.worker.spawn import prestart_local_worker

    try:
        fleet = fleet_from_settings(settings)
        (model,) = fleet.models.values()
        (spec,) = model.versions.values()
    except Exception:  # an invalid setting: the normal start-up reports it
        return
    if spec.replicas >= 1:
        launch = replica_launch(settings, spec, local_replica_count(fleet))
        prestart_local_worker(launch.model, launch.dtype, launch.engine_args)


def _serve(args: argparse.Namespace, settings) -> int:  # Settings
    import asyncio

    from sluice.api.serve_main import serve
    from sluice.observability.logs import configure as configure_logs
    from sluice.observability.tracing import configure as configure_tracing

    configure_logs(settings.log_level, settings.log_format)
    configure_tracing(settings.trace_exporter, "sluice-gateway", settings.otlp_endpoint, settings.trace_file)
    if settings.api_key is None:
        if settings.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"sluice: warning: no API key set; binding 127.0.0.1 instead of {settings.host}", file=sys.stderr)
            settings.host = "127.0.0.1"
        print(
            "sluice: warning: no API key set (--api-key / SLUICE_API_KEY): the server is open to local callers",
            file=sys.stderr,
        )
    from sluice.thread_name import name_this_thread

    name_this_thread("sluice-serve")  # the process's name in ps and top: the main thread's
    return asyncio.run(serve(settings, access_log=args.access_log))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the Anthropic Messages and OpenAI chat APIs over HTTP")
    add_setting_flags(p, Settings, _LISTEN_FLAGS + _MODEL_FLAGS)
    p.add_argument(
        "--config", default=None, metavar="FILE", help="a TOML settings file (keys as in SLUICE_* without the prefix)"
    )
    add_setting_flags(p, Settings, _FLEET_FLAGS + _STREAM_FLAGS)
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    add_engine_args(p)
    p.set_defaults(func=_run)
