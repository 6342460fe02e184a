"""The example tier prices that the embedded demo (router/server/demo.py) and the simulator's
defaults (simulations/sim_config.py) both use, so `cost-router simulate` without a config replays
what `cost-router serve` without a config charges: the RouteLLM data README's GPT-4-class ("large")
and Mixtral-class ("small") models, USD per million input / output tokens."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from backends.config import Price

# Cheapest first, as the demo lists its tiers. Read-only: Price is a model, the mapping a proxy.
EXAMPLE_PRICES: Mapping[str, Price] = MappingProxyType(
    {
        "small": Price(input_per_mtok=0.6, output_per_mtok=0.6),
        "large": Price(input_per_mtok=10.0, output_per_mtok=30.0),
    }
)
