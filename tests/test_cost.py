"""Cost: the backend's reported figure wins; else the price table by model prefix."""

import pytest

from ollie.cost import cost_of, price_of
from ollie.types import Usage


def test_reported_cost_wins_even_for_unknown_models():
    assert cost_of("some/unknown-model", Usage(input_tokens=10**6, cost=0.0123)) == (0.0123, True)


def test_unknown_model_costs_nothing_and_says_so():
    assert cost_of("llama3.2", Usage(input_tokens=10**6, output_tokens=10**6)) == (0.0, False)


@pytest.mark.parametrize(
    "model, price",
    [
        ("gpt-4o-mini-2024-07-18", (0.15, 0.6)),  # not priced as gpt-4o
        ("gpt-4o-2024-08-06", (2.5, 10.0)),
        ("o3-mini", (1.1, 4.4)),
        ("o3", (10.0, 40.0)),
        ("claude-sonnet-4-5-20250929", (3.0, 15.0)),
        ("anthropic/claude-3-5-haiku", (0.8, 4.0)),  # router prefix ignored
        ("google/gemini-2.5-flash", (0.15, 0.6)),
    ],
)
def test_longest_prefix_decides_the_price(model, price):
    assert price_of(model) == price


def test_input_output_per_million():
    usd, known = cost_of("gpt-4o", Usage(input_tokens=2_000_000, output_tokens=500_000))
    assert known and usd == pytest.approx(2 * 2.5 + 0.5 * 10)


def test_cached_input_is_ten_percent_for_claude_and_half_otherwise():
    claude, _ = cost_of("claude-sonnet-4", Usage(cache_read_tokens=1_000_000))
    gpt, _ = cost_of("gpt-4o", Usage(cache_read_tokens=1_000_000))
    assert claude == pytest.approx(0.3)
    assert gpt == pytest.approx(1.25)


def test_cache_creation_is_125_percent_of_input():
    usd, _ = cost_of("claude-opus-4-1", Usage(cache_write_tokens=1_000_000))
    assert usd == pytest.approx(15 * 1.25)
