"""Which version of a model serves a request: weighted, sticky, or pinned.

Weighted rendezvous hashing (highest random weight). For a sticky key k and each version v
with traffic weight w_v > 0, draw u = hash(k, model, v) uniformly in (0, 1) and score
w_v / -ln(u); the highest score wins. -ln(u) is exponentially distributed, so the winner is v
with probability w_v / Σw — the traffic split — and the choice is a pure function of (key,
weights): no table to store or share, every gateway replica agrees, a key keeps its version
while the weights stay.

Minimal disruption, by construction: a key's draw for one version never depends on the others.
When a canary grows 10 % → 20 % (its weight rises, the rest shrink in proportion), the canary's
score rises and every other score falls by the same factor, so a key already on the canary
stays there, keys move only *into* the canary, and exactly the new 10 % move. Adding a version
only takes keys into it; removing one (or skipping it while it is unavailable) moves only its
own keys, each to its next-best version, and they come back when it returns.

The sticky key is the caller's: Anthropic `metadata.user_id`, OpenAI `user`, else the API key
id, each under the tenant (two tenants' "alice" are different people). With none of them the
caller passes the request id, which gives a weighted but per-request choice.

Pinning: the request header `sluice-model-version: <model>/<version>` (or just `<version>`)
asks for one version; the model's tier policy says whether the caller's tier may. A pin to a
version with traffic 0 is allowed — that is how a version is tried before it gets traffic.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping

from sluice.errors import InvalidRequestError
from sluice.routing.errors import ModelUnavailableError, PinNotAllowedError, UnknownVersionError
from sluice.routing.fleet_file.schema import ModelSpec

VERSION_HEADER = "sluice-model-version"  # on every generation response; a pin on a request
_TWO_64 = float(2**64)


def sticky_key(
    tenant: str, user_id: str | None = None, openai_user: str | None = None, api_key_id: str | None = None
) -> str | None:
    """The stickiness key for a request, or None when the request carries no identity."""
    for value in (user_id, openai_user, api_key_id):
        if value:
            return f"{len(tenant)}:{tenant}:{value}"
    return None


def version_header(model_id: str, version: str) -> str:
    return f"{model_id}/{version}"


def _uniform(key: str, model_id: str, version: str) -> float:
    # Length-prefixed so that no (key, model, version) triple can spell another's input.
    data = f"{len(key)}:{key}|{len(model_id)}:{model_id}|{version}".encode()
    n = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    return (n + 0.5) / _TWO_64  # strictly inside (0, 1): ln never sees 0 or 1


def rendezvous_score(key: str, model_id: str, version: str, weight: float) -> float:
    return weight / -math.log(_uniform(key, model_id, version))


def choose_version(model_id: str, weights: Mapping[str, float], key: str) -> str:
    """The version that serves `key`, among `weights` (version → traffic weight; the caller
    leaves out versions that cannot take requests now). Ties cannot happen in practice (64-bit
    draws); the name breaks them anyway, so the result is a function of its inputs."""
    best, best_score = None, -1.0
    for version, weight in weights.items():
        if weight <= 0:
            continue
        score = rendezvous_score(key, model_id, version, weight)
        if score > best_score or (score == best_score and best is not None and version < best):
            best, best_score = version, score
    if best is None:
        raise ModelUnavailableError(f"model {model_id!r} has no version that can take requests now")
    return best


def resolve_pin(value: str, model_id: str, model: ModelSpec, tier: str, resolve_model: Callable[[str], str]) -> str:
    """The version a `sluice-model-version` request header pins, after checking the tier may
    pin and the version exists. `resolve_model` maps an id or alias to its canonical id."""
    text = value.strip()
    model_part, sep, version = text.rpartition("/")
    if sep:
        try:
            pinned_model = resolve_model(model_part)
        except InvalidRequestError:
            pinned_model = None
        if pinned_model != model_id:
            raise InvalidRequestError(f"{VERSION_HEADER} pins {text!r}, but the request is for model {model_id!r}")
    if not version:
        raise InvalidRequestError(f"{VERSION_HEADER} must be <model>/<version> or <version>")
    if not model.tier_policy(tier).allow_pin:
        raise PinNotAllowedError(f"tier {tier!r} may not pin a model version ({VERSION_HEADER})")
    if version not in model.versions:
        raise UnknownVersionError(
            f"model {model_id!r} has no version {version!r}; versions: {', '.join(model.versions)}"
        )
    return version
