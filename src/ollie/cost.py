"""What a request cost in USD: the backend's own figure when it reports one, else a price.

Prices come from, in order: the user's `$OLLIE_CFG_PATH/prices.yaml`; $0 for the backends that run
on the user's own machines (`FREE_BACKENDS`); the `genai-prices` package, a price list kept up to
date upstream and bundled with its release (no network at run time), which knows tiered prices,
cache reads and writes. Anything else has no known price: it is counted as $0 and said so.

Token convention (every backend fills `Usage` this way): `input_tokens` are the uncached input
tokens; `cache_read_tokens` and `cache_write_tokens` are counted apart from them. Reasoning tokens
are part of `output_tokens`, as providers report and bill them.

`prices.yaml` maps a model name, or a prefix ending in `*`, to USD per million tokens:

    my-finetune: {input: 0.5, output: 1.5, cache_read: 0.05, cache_write: 0.6}
    "llama-*": 0          # free
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from .config import cfg_path
from .types import ConfigError, Usage

# Backends that bill nothing per token: the embedded model, servers on the user's own machines, and
# the scripted test double.
FREE_BACKENDS = frozenset({"local", "ollama", "llamacpp", "vllm", "lmstudio", "scripted"})
# The genai-prices provider of a backend whose requests go to that provider's own API.
_PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "openrouter": "openrouter"}
ALLOW_UNPRICED = "OLLIE_ALLOW_UNPRICED"


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. A cache rate of None: the input rate."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def of(self, usage: Usage) -> float:
        return (
            usage.input_tokens * self.input
            + usage.cache_read_tokens * (self.input if self.cache_read is None else self.cache_read)
            + usage.cache_write_tokens * (self.input if self.cache_write is None else self.cache_write)
            + usage.output_tokens * self.output
        ) / 1_000_000


FREE = Price(0.0, 0.0)


def cost_of(model: str, usage: Usage, backend: str = "") -> tuple[float, bool]:
    """(USD, known). An unknown price costs 0 with known=False, so that callers can say so."""
    if usage.cost is not None:
        return usage.cost, True
    own = user_price(model)
    if own is not None:
        return own.of(usage), True
    if backend in FREE_BACKENDS:
        return 0.0, True
    usd = _listed_cost(model, usage, _PROVIDERS.get(backend))
    return (0.0, False) if usd is None else (usd, True)


def price_known(model: str, backend: str = "") -> bool:
    """Whether requests of `model` on `backend` are priced (a backend that reports each request's
    cost, OpenRouter, prices them all)."""
    return backend == "openrouter" or cost_of(model, Usage(input_tokens=1), backend)[1]


def unpriced_message(model: str, backend: str, cap: str) -> str:
    """Why a spending cap refuses a model without a price, and the two ways on."""
    return (
        f"no price is known for model {model!r} (backend {backend}), so OLLIE_MAX_SESSION_COST=${cap} "
        f"cannot be kept; give it a price in {prices_path()} (e.g. '{model}: {{input: 3, output: 15}}', "
        f"USD per million tokens), or set {ALLOW_UNPRICED}=1 to run it counted as $0"
    )


def unknown_notice(model: str, backend: str) -> str:
    return (
        f"no price is known for model {model!r} (backend {backend}): its requests are counted as $0 and "
        f"`cost` says unknown; give it a price in {prices_path()}"
    )


# ---- the user's prices -------------------------------------------------------------------------------


def prices_path() -> Path:
    return cfg_path() / "prices.yaml"


_loaded: tuple[tuple[str, int], dict[str, Price]] | None = None


def user_prices() -> dict[str, Price]:
    """`prices.yaml`, read again when it changes; {} when there is none."""
    global _loaded
    path = prices_path()
    try:
        stamp = (str(path), path.stat().st_mtime_ns)
    except OSError:
        return {}
    if _loaded is None or _loaded[0] != stamp:
        _loaded = (stamp, _parse(path))
    return _loaded[1]


def _parse(path: Path) -> dict[str, Price]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of model names to prices, got {type(data).__name__}")
    prices = {}
    for name, value in data.items():
        where = f"{path}: {name!r}"
        if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
            prices[str(name).lower()] = FREE
            continue
        if not isinstance(value, dict) or not {"input", "output"} <= value.keys():
            raise ConfigError(f"{where}: give {{input: N, output: N}} in USD per million tokens (or 0: free)")
        if unknown := set(value) - {"input", "output", "cache_read", "cache_write"}:
            fields = "input, output, cache_read, cache_write"
            raise ConfigError(f"{where}: unknown field {sorted(unknown)[0]!r}; fields: {fields}")
        rates: dict[str, Any] = {}
        for key, rate in value.items():
            if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
                raise ConfigError(f"{where}: {key} must be a number of USD per million tokens, not {rate!r}")
            rates[key] = float(rate)
        prices[str(name).lower()] = Price(**rates)
    return prices


def user_price(model: str) -> Price | None:
    """The user's price for `model`: its exact name, else the longest `prefix*` that matches (a
    router's prefix such as `anthropic/` may be left out of the name)."""
    prices = user_prices()
    if not prices:
        return None
    name = model.lower()
    names = (name, name.rsplit("/", 1)[-1])
    for n in names:
        if n in prices:
            return prices[n]
    best = max(
        (k for k in prices if k.endswith("*") and any(n.startswith(k[:-1]) for n in names)), key=len, default=None
    )
    return None if best is None else prices[best]


# ---- the maintained price list -------------------------------------------------------------------------

_import_lock = threading.Lock()
_warming: threading.Thread | None = None


def warm(backend: str) -> None:
    """Import the price list in the background (it takes 0.1-0.2 s) while a priced backend's first
    request is on its way, so that pricing its answer waits for nothing."""
    global _warming
    if _warming is not None or backend in FREE_BACKENDS or backend == "openrouter":
        return
    with _import_lock:
        if _warming is None:
            _warming = threading.Thread(target=_import_prices, name="ollie-prices", daemon=True)
            _warming.start()


def _import_prices() -> Any:
    try:
        import genai_prices
    except ImportError:
        return None
    return genai_prices


_listed: dict[tuple[str, str | None], Price | Any | None] = {}  # the lookups, made once per process


def _listed_cost(model: str, usage: Usage, provider: str | None) -> float | None:
    """The price list's figure for one request, or None. A model priced per token alike at any
    size is priced here (a few microseconds); one with tiers (a higher rate past some input size)
    by the list's own calculation, which takes the request's size into account (~0.1 ms)."""
    key = (model, provider)
    if key not in _listed:
        _listed[key] = _look_up(model, provider)
    price = _listed[key]
    if price is None or isinstance(price, Price):
        return None if price is None else price.of(usage)
    prices = _import_prices()
    listed = prices.Usage(
        input_tokens=usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
    )
    return float(price.calc_price(listed)["total_price"])


_RATES = ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")


def _look_up(model: str, provider: str | None) -> Price | Any | None:
    """The list's current price of `model` (from `provider`, else whichever lists it): a `Price`
    when its token rates are flat, else the list's own price object; None when it is not listed."""
    prices = _import_prices()
    if prices is None:
        return None

    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    tries = [(model, provider)]
    if provider is not None:
        tries.append((model, None))  # the backend may point at another provider's compatible API
    if "/" in model:
        tries.append((model.rsplit("/", 1)[-1], None))  # a router's prefix
    for ref, pid in tries:
        try:
            _, info = snapshot.find_provider_model(ref, None, pid, None)
        except (LookupError, ValueError):
            continue
        listed = info.get_prices(datetime.now(tz=UTC))
        rates = [getattr(listed, name, None) for name in _RATES]
        if rates[0] is None or rates[1] is None:
            return listed
        if all(r is None or isinstance(r, Decimal) for r in rates):
            return Price(*(None if r is None else float(r) for r in rates))  # type: ignore[arg-type]
        return listed
    return None
