"""The web search tool's `allowed_domains` / `blocked_domains`, as Anthropic documents them,
applied to each hit's source URL.

An entry is a domain, optionally with a path: no scheme (`example.com`, not
`https://example.com`); a domain covers its subdomains (`example.com` covers
`docs.example.com`), a subdomain only itself and those below it (`docs.example.com` does not
cover `example.com` or `api.example.com`); a path covers what is under it (`example.com/blog`
covers `example.com/blog/post-1`), and may hold one `*` (any characters), never in the domain
part (`*.example.com` is refused). A request gives one list or the other, not both.

The search service is asked to apply the domain part itself (a filter on the hits' `url.domain`,
docs/SEARCH.md "Filters"), so a page of hits is a page of permitted hits; then every hit is
checked here against the whole rule, path included, so a hit from a blocked domain never
reaches the model whatever the service answered. A hit without a `url` (its source is
`sluice-search:<id>`) has no domain: an allow list excludes it, a block list keeps it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

MAX_ENTRIES = 256  # the search service's bound on the values of one filter clause
_HOST = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")


@dataclasses.dataclass(frozen=True, slots=True)
class DomainRule:
    host: str
    path: re.Pattern[str] | None  # None: every path

    @classmethod
    def parse(cls, entry: str) -> DomainRule:
        """ValueError saying what is wrong with the entry."""
        text = entry.strip().lower()
        if "://" in text:
            raise ValueError(f"{entry[:80]!r}: give the domain without a scheme (example.com, not https://example.com)")
        host, slash, path = text.partition("/")
        if "*" in host:
            raise ValueError(f"{entry[:80]!r}: a wildcard may only follow the domain, in its path (example.com/*)")
        if not _HOST.match(host.rstrip(".")):
            raise ValueError(f"{entry[:80]!r} is not a domain")
        if path.count("*") > 1:
            raise ValueError(f"{entry[:80]!r}: at most one wildcard")
        if not slash or path in ("", "*"):
            return cls(host.rstrip("."), None)
        pattern = re.escape("/" + path.rstrip("/")).replace(r"\*", ".*")
        return cls(host.rstrip("."), re.compile(pattern + r"(?:/.*)?$"))

    def matches(self, host: str, path: str) -> bool:
        if host != self.host and not host.endswith("." + self.host):
            return False
        return self.path is None or bool(self.path.match(path or "/"))


@dataclasses.dataclass(frozen=True, slots=True)
class DomainRules:
    allowed: tuple[DomainRule, ...] = ()
    blocked: tuple[DomainRule, ...] = ()

    @classmethod
    def parse(cls, allowed: Sequence[str] | None, blocked: Sequence[str] | None) -> DomainRules:
        if allowed is not None and blocked is not None:
            raise ValueError("use either allowed_domains or blocked_domains, not both")
        for entries in (allowed, blocked):
            if entries is not None and len(entries) > MAX_ENTRIES:
                raise ValueError(f"at most {MAX_ENTRIES} domains")
        return cls(tuple(DomainRule.parse(e) for e in allowed or ()), tuple(DomainRule.parse(e) for e in blocked or ()))

    def __bool__(self) -> bool:
        return bool(self.allowed or self.blocked)

    def permits(self, url: str | None) -> bool:
        """Whether a hit whose source is `url` (None: no url) may reach the model."""
        parts = urlsplit(url) if url else None
        host = (parts.hostname or "") if parts is not None else ""
        path = parts.path if parts is not None else ""
        if self.allowed:
            return bool(host) and any(r.matches(host, path) for r in self.allowed)
        return not (host and any(r.matches(host, path) for r in self.blocked))

    def service_filter(self) -> dict[str, dict[str, list[str]]] | None:
        """What the search service can apply itself: the domain part (never more than the rules
        permit for a block list, never less for an allow list)."""
        if self.allowed:
            return {"url.domain": {"in": sorted({r.host for r in self.allowed})}}
        whole = sorted({r.host for r in self.blocked if r.path is None})
        return {"url.domain": {"not_in": whole}} if whole else None

    @property
    def has_paths(self) -> bool:
        """Some rule names a path: the service's answer may hold hits this check drops."""
        return any(r.path is not None for r in (*self.allowed, *self.blocked))
