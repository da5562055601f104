"""What a request cost in USD: the backend's own figure when it reports one, else a price table.

Token convention (every backend fills `Usage` this way): `input_tokens` are the uncached input
tokens; `cache_read_tokens` and `cache_write_tokens` are counted apart from them.
"""

from __future__ import annotations

from .types import Usage

# USD per million tokens (input, output), by model-name prefix.
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-haiku-4": (0.8, 4.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
    "gpt-4o-mini": (0.15, 0.6),
    "gpt-4o": (2.5, 10.0),
    "gpt-4-turbo": (10.0, 30.0),
    "o1-mini": (3.0, 12.0),
    "o3-mini": (1.1, 4.4),
    "o1": (15.0, 60.0),
    "o3": (10.0, 40.0),
    "gemini-2.5-pro": (1.25, 10.0),
    "gemini-2.5-flash": (0.15, 0.6),
    "gemini-2.0-flash": (0.1, 0.4),
}
# Longest prefix first, so "gpt-4o-mini" is not priced as "gpt-4o".
_BY_LENGTH = sorted(PRICES, key=len, reverse=True)

CACHE_WRITE_RATE = 1.25  # cache creation costs 125 % of the input rate


def price_of(model: str) -> tuple[float, float] | None:
    """(input, output) USD per million tokens, or None for a model not in the table.
    A router prefix such as "anthropic/" in "anthropic/claude-sonnet-4" is ignored."""
    name = model.rsplit("/", 1)[-1].lower()
    for prefix in _BY_LENGTH:
        if name.startswith(prefix):
            return PRICES[prefix]
    return None


def cost_of(model: str, usage: Usage) -> tuple[float, bool]:
    """(USD, known). Unknown models cost 0 with known=False, so callers can say so."""
    if usage.cost is not None:
        return usage.cost, True
    price = price_of(model)
    if price is None:
        return 0.0, False
    rate_in, rate_out = price
    cache_read_rate = 0.10 if "claude" in model.lower() else 0.50
    usd = (
        usage.input_tokens * rate_in
        + usage.cache_read_tokens * rate_in * cache_read_rate
        + usage.cache_write_tokens * rate_in * CACHE_WRITE_RATE
        + usage.output_tokens * rate_out
    ) / 1_000_000
    return usd, True
