"""Cost: the backend's reported figure wins; then the user's prices.yaml; free backends; then the
maintained price list (genai-prices, bundled: no network)."""

import os

import pytest

from ollie import cost
from ollie.chatfmt import cost_text
from ollie.cost import cost_of, price_known
from ollie.types import ConfigError, Cost, Usage

M = 1_000_000


def test_reported_cost_wins_even_for_unknown_models():
    assert cost_of("some/unknown-model", Usage(input_tokens=M, cost=0.0123), "openai") == (0.0123, True)


def test_unknown_model_costs_nothing_and_says_so():
    assert cost_of("mystery-model-7", Usage(input_tokens=M, output_tokens=M), "openai") == (0.0, False)
    assert not price_known("mystery-model-7", "openai")


def test_models_on_the_users_own_machines_are_free():
    for backend in ("ollama", "local", "llamacpp", "vllm", "lmstudio", "scripted"):
        assert cost_of("llama3.2", Usage(input_tokens=M, output_tokens=M), backend) == (0.0, True)


# The models the README and the backends name, at the maintained list's prices (USD per million
# tokens in, out): 100k tokens in and 100k out each.
@pytest.mark.parametrize(
    "model, backend, usd",
    [
        ("claude-sonnet-4-6", "anthropic", 0.1 * 3 + 0.1 * 15),  # the anthropic backend's default
        ("claude-sonnet-4-5", "anthropic", 0.1 * 3 + 0.1 * 15),
        ("claude-haiku-4-5", "anthropic", 0.1 * 1 + 0.1 * 5),
        ("claude-opus-4-5", "anthropic", 0.1 * 5 + 0.1 * 25),  # the old table charged $9.00
        ("gpt-4.1", "openai", 0.1 * 2 + 0.1 * 8),  # unknown to the old table
        ("gpt-5", "openai", 0.1 * 1.25 + 0.1 * 10),
        ("gpt-4o-mini", "openai", 0.1 * 0.15 + 0.1 * 0.6),  # the openai backend's default
        ("gemini-2.5-flash", "openai", 0.1 * 0.3 + 0.1 * 2.5),  # Google's OpenAI-compatible API
    ],
)
def test_the_price_list_prices_the_models_we_name(model, backend, usd):
    got, known = cost_of(model, Usage(input_tokens=100_000, output_tokens=100_000), backend)
    assert known and got == pytest.approx(usd)


def test_cache_reads_and_writes_are_priced_at_their_own_rates():
    # Claude Sonnet 4.6: cache reads at 10 % of input, 5-minute cache writes at 125 %.
    usd, known = cost_of("claude-sonnet-4-6", Usage(cache_read_tokens=100_000, cache_write_tokens=100_000), "anthropic")
    assert known and usd == pytest.approx(0.1 * 0.3 + 0.1 * 3.75)
    usd, _ = cost_of("gpt-4.1", Usage(cache_read_tokens=100_000), "openai")
    assert usd == pytest.approx(0.1 * 0.5)


def test_a_router_prefix_is_looked_through():
    usd, known = cost_of("anthropic/claude-haiku-4-5", Usage(input_tokens=M), "openai")
    assert known and usd == pytest.approx(1.0)


@pytest.fixture
def prices(ollie_dirs):
    path = ollie_dirs / "cfg" / "prices.yaml"

    def write(text):
        path.write_text(text)
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000))  # a new stamp, even within a tick

    return write


def test_the_users_prices_win(prices):
    prices("my-finetune: {input: 2, output: 4, cache_read: 0.5}\n'gpt-5*': {input: 1, output: 1}\nllama3.2: 0\n")
    usage = Usage(input_tokens=M, output_tokens=M, cache_read_tokens=M)
    assert cost_of("my-finetune", usage, "openai") == (pytest.approx(6.5), True)
    assert cost_of("gpt-5-mini", Usage(input_tokens=M), "openai") == (pytest.approx(1.0), True)  # longest prefix
    assert cost_of("llama3.2", usage, "openai") == (0.0, True)
    assert price_known("my-finetune", "openai")


@pytest.mark.parametrize(
    "text, said",
    [
        ("m: {input: 1}\n", "give {input: N, output: N}"),
        ("m: {input: 1, output: -1}\n", "output must be a number"),
        ("m: {input: 1, output: 1, batch: 1}\n", "unknown field 'batch'"),
        ("- m\n", "expected a mapping"),
    ],
)
def test_a_bad_prices_file_names_the_file_and_the_fix(prices, text, said):
    prices(text)
    with pytest.raises(ConfigError, match="prices.yaml") as e:
        cost.user_prices()
    assert said in str(e.value)


def test_cost_says_unknown_for_an_unpriced_model():
    assert cost_text(Cost(0.0, 0.0, False), "m").startswith("costLast=unknown\ncostSession=unknown\n")
    assert "costSession=$0.500000 + unknown" in cost_text(Cost(0.0, 0.5, False), "m")
    assert cost_text(Cost(0.1, 0.5, True), "m") == "costLast=$0.100000\ncostSession=$0.500000"
