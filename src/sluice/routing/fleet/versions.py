"""What the gateway holds per model version: its tokenizer (the gateway renders every prompt,
so each version's weights must be readable here) and the engine's limits once a worker of it
answered."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import EngineUnavailableError, ModelLoadError
from sluice.models.tokenizer import Tokenizer
from sluice.routing.dispatch.health_poller import WorkerHandle
from sluice.routing.fleet_file.schema import BUNDLED, VersionSpec
from sluice.worker.engine_client import ModelInfo


@dataclass(slots=True)
class VersionRuntime:
    tokenizer: Tokenizer
    info: ModelInfo | None = None  # from a worker, once one answered


@dataclass
class VersionRuntimes:
    handles: Callable[[], Iterable[WorkerHandle]]  # the fleet's workers, where model info comes from
    # whose workers serve a version: its base for a LoRA adapter version (WorkerPool.base_of)
    base_of: Callable[[str, str], tuple[str, str]] = lambda m, v: (m, v)
    versions: dict[tuple[str, str], VersionRuntime] = field(default_factory=dict)
    _tokenizers: dict[str, Tokenizer] = field(default_factory=dict)  # weights path -> tokenizer

    def tokenizer_for(self, spec: VersionSpec) -> Tokenizer:
        """The version's tokenizer (one per weights path; blocking: call it off the loop)."""
        from sluice.models.tokenizer_loader import load_tokenizer

        key = spec.own_weights
        if key not in self._tokenizers:
            path = None if key == BUNDLED else key
            if path is not None and not Path(path).exists():
                raise ModelLoadError(
                    f"{path}: the gateway renders prompts with each version's tokenizer, so its "
                    "weights must be readable on the gateway's host too"
                )
            self._tokenizers[key] = load_tokenizer(path)[0]
        return self._tokenizers[key]

    def add(self, model_id: str, version: str, spec: VersionSpec) -> None:
        """`spec`: the version's, or for an adapter version its base's (whose tokenizer it uses)."""
        self.versions[(model_id, version)] = VersionRuntime(self.tokenizer_for(spec))

    def sync(self, declared: dict[tuple[str, str], VersionSpec]) -> None:
        """Runtimes for exactly the declared versions (after a reload)."""
        for key in [k for k in self.versions if k not in declared]:
            del self.versions[key]
        for key, spec in declared.items():
            if key not in self.versions:
                self.add(*key, spec)

    def get(self, model_id: str, version: str) -> VersionRuntime:
        runtime = self.versions[(model_id, version)]
        if runtime.info is None:
            serving = self.base_of(model_id, version)
            runtime.info = next(
                (h.info for h in self.handles() if (h.model_id, h.version) == serving and h.info is not None), None
            )
        return runtime

    def max_model_len(self, model_id: str, version: str) -> int:
        info = self.get(model_id, version).info
        if info is None:
            raise EngineUnavailableError(f"no worker of {model_id}/{version} has answered yet")
        return info.max_model_len

    def model_window(self, model_id: str) -> int | None:
        """The smallest context window among the model's versions that have answered."""
        windows = [
            info.max_model_len
            for (m, v) in self.versions
            if m == model_id and (info := self.get(m, v).info) is not None
        ]
        return min(windows) if windows else None
