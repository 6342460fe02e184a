"""One scrape of a vLLM server's Prometheus /metrics: the sample names we read and the parser.

vLLM exposes gauges (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`) and monotonically growing counters/histograms; a `Scrape` keeps both,
summed over label sets, so backends/tier_signals.py can turn two of them into rates.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Sample names as exposed (counters carry _total, histograms _sum/_count).
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, pre-v1 name
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
# Per-output-token latency: current name first, the deprecated one second.
TPOT = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
E2E = "vllm:e2e_request_latency_seconds"


@dataclass(frozen=True, slots=True)
class Scrape:
    """Values of one /metrics scrape, each summed over label sets (engines, model names)."""

    gauges: dict[str, float]
    counters: dict[str, float]  # counter and histogram _sum/_count samples, cumulative

    def gauge(self, *names: str) -> float | None:
        return next((self.gauges[n] for n in names if n in self.gauges), None)


def parse_metrics(text: str) -> Scrape:
    """Parses Prometheus exposition text (raises ValueError on malformed input)."""
    gauges: dict[str, float] = {}
    counters: dict[str, float] = {}
    kv_max: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "gauge":
                # Cache usage is a fraction per engine: the fullest engine is what limits us.
                if sample.name in KV_CACHE:
                    kv_max[sample.name] = max(kv_max.get(sample.name, 0.0), sample.value)
                else:
                    gauges[sample.name] = gauges.get(sample.name, 0.0) + sample.value
            elif family.type in ("counter", "histogram") and not sample.name.endswith("_bucket"):
                counters[sample.name] = counters.get(sample.name, 0.0) + sample.value
    gauges.update(kv_max)
    return Scrape(gauges=gauges, counters=counters)
