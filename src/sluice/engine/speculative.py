"""Speculative decoding without a draft model: n-gram (prompt lookup) proposals.

A request's own context (prompt + output so far) often predicts its next tokens: a reply that
quotes, edits or echoes its prompt, a JSON object that repeats keys, code that repeats names.
The proposer looks for the most recent earlier occurrence of the context's last n tokens
(n = NGRAM_MAX down to NGRAM_MIN) and proposes the k tokens that followed it there. The runner
verifies them in the same forward as the request's decode (one row per position, each a decode
of its own context over the request's blocks), the sampler picks a token at every row exactly as
plain decoding would at that output position, and the engine keeps the longest prefix of
proposals that equal the picks, plus the pick after it (the "bonus" token).

Why this is exact, greedy and sampled alike: a request's token at output position i depends only
on the logits there, its seed and i (models/sampler.py). The rows' logits are those plain decoding
computes once the earlier proposals are accepted (each row is a decode of exactly that context),
so "accept while the pick equals the proposal" reproduces plain decoding token for token, and its
distribution with it. (It is rejection sampling against a deterministic proposal: accept
proposal x with probability p(x); the residual distribution is p without x, renormalised, and the
pick given it is not x is exactly that.)

When it pays: a step with more rows costs more. The engine keeps, per request, a running rate of
accepted proposals, and proposes the k that maximises the expected throughput of the whole step
(`choose_k`); a request whose proposals keep failing stops proposing and probes again after a
back-off that doubles each time. No earlier occurrence, no proposal, no cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# n-gram lengths tried, longest first. 1-grams match almost everywhere in free text and mostly
# propose noise; 2-grams already find quotes and repeated structure.
NGRAM_MAX = 4
NGRAM_MIN = 2
# A step's cost, in rows: `FIXED_ROWS` rows' worth of work that does not grow with the batch
# (reading the weights) plus one per row. Measured on the AVX2 CPU kernels at batch 1
# (docs/BENCHMARKS.md, "Speculative decoding"): 1, 2, 3, 4 rows took 1 : 1.18 : 1.22 : 1.3-1.4,
# a row ~1/6 of a step; the 5th row costs ~half a step and later ones ~0.3 each, which
# serving's default cap of 3 proposals (4 rows) stays clear of.
FIXED_ROWS = 5.0
# The acceptance rate a request starts with (a prior worth PRIOR_WEIGHT proposals), and how much
# of the running rate each new verdict replaces.
PRIOR_RATE = 0.6
RATE_DECAY = 0.8
# A request whose rate makes speculation unprofitable waits this many steps before probing
# again, doubling each time a probe fails, up to MAX_BACKOFF.
FIRST_BACKOFF = 8
MAX_BACKOFF = 256


@dataclass(slots=True)
class NgramIndex:
    """Where each n-gram of a token list last occurred (the position right after it), kept
    up to date incrementally: indexing a new token costs NGRAM_MAX dict writes."""

    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)
    num_indexed: int = 0  # tokens [0, num_indexed) are indexed

    def update(self, tokens: list[int]) -> None:
        # an n-gram ending at position e - 1 is recorded once its continuation tokens[e] exists,
        # so the context's own final n-gram never matches itself
        for end in range(max(self.num_indexed, 1), len(tokens)):
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if end >= n:
                    self.last_end[tuple(tokens[end - n : end])] = end
        self.num_indexed = max(self.num_indexed, len(tokens))

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        self.update(tokens)
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if len(tokens) <= n:
                continue
            end = self.last_end.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end : end + k]
        return []


@dataclass(slots=True)
class SpecState:
    """One request's speculation: its n-gram index, acceptance rate and back-off."""

    index: NgramIndex = field(default_factory=NgramIndex)
    rate: float = PRIOR_RATE  # running share of proposals accepted (a proposal reached, that is)
    paused_steps: int = 0  # steps left before probing again
    backoff: int = FIRST_BACKOFF
    proposed: int = 0  # cumulative, for statistics
    accepted: int = 0

    def record(self, num_proposed: int, num_accepted: int) -> None:
        """A verdict: of `num_proposed` proposals the first `num_accepted` were accepted. Each
        proposal up to and including the first rejected one was a trial."""
        self.proposed += num_proposed
        self.accepted += num_accepted
        trials = min(num_accepted + 1, num_proposed)
        for i in range(trials):
            hit = 1.0 if i < num_accepted else 0.0
            self.rate = RATE_DECAY * self.rate + (1 - RATE_DECAY) * hit


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a step yields with k proposals each accepted with probability `rate` (given the
    previous one was): 1 + rate + rate² + … + rate^k."""
    return float(k + 1) if rate >= 1.0 else (1.0 - rate ** (k + 1)) / (1.0 - rate)


def choose_k(rate: float, max_k: int, batch_rows: int) -> int:
    """The number of proposals that maximises the step's throughput.

    A step of B rows costs FIXED_ROWS + B; k more rows make it cost k more and yield
    expected_tokens(rate, k) − 1 more tokens. Throughput relative to no speculation:
    (B + E(k) − 1) / B × (FIXED_ROWS + B) / (FIXED_ROWS + B + k). At one stream a row costs
    ~1/6 of the step and speculating pays from a ~20 % acceptance rate; at 32 streams a row costs
    ~1/37 and only near-certain proposals pay."""
    b = max(batch_rows, 1)
    base = FIXED_ROWS + b
    best_k, best = 0, 1.0
    for k in range(1, max_k + 1):
        gain = (b + expected_tokens(rate, k) - 1) / b * base / (base + k)
        if gain > best * 1.0001:
            best_k, best = k, gain
    return best_k


def accepted_tokens(proposal: list[int], picks: list[int]) -> list[int]:
    """The tokens a verified step appends: the proposals up to the first that differs from the
    pick at its row, then the pick at that row (all proposals accepted: the pick after them).
    `picks` has one token per row, len(proposal) + 1 rows."""
    for i, token in enumerate(proposal):
        if picks[i] != token:
            return picks[: i + 1]
    return picks[: len(proposal) + 1]


class Speculator:
    """Decides each decode's proposals (the scheduler asks, per running request, per step)."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens

    def propose(self, state: SpecState, tokens: list[int], limit: int, batch_rows: int) -> list[int]:
        """Proposals for the request whose context is `tokens`: at most `limit` (its max_tokens,
        the context window and the step's budget all bound it), none while backing off."""
        if state.paused_steps > 0:
            state.paused_steps -= 1
            return []
        limit = min(limit, self.max_tokens)
        if limit <= 0:
            return []
        if choose_k(state.rate, limit, 1) == 0:
            # unprofitable even alone: back off, then probe afresh (the probe's verdict decides)
            state.paused_steps = state.backoff
            state.backoff = min(2 * state.backoff, MAX_BACKOFF)
            state.rate = max(state.rate, PRIOR_RATE)
            return []
        k = choose_k(state.rate, limit, batch_rows)  # 0 when the batch is too big for this rate
        return state.index.propose(tokens, k) if k else []

    @staticmethod
    def record(state: SpecState, num_proposed: int, num_accepted: int) -> None:
        state.record(num_proposed, num_accepted)
        if num_accepted:
            state.backoff = FIRST_BACKOFF
