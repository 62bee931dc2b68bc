// Engine statistics in the Prometheus text exposition format (version 0.0.4), for GET /metrics.
// Pure: engine_stats in, text out, so the format is tested without a server. Latency histograms
// are kept in milliseconds by the engine and exposed in seconds, as Prometheus names them.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace anvil::proto {

// The Content-Type of the text format.
inline constexpr const char* metrics_content_type = "text/plain; version=0.0.4; charset=utf-8";

// Open connections by protocol ("http", "line"): the anvil_connections gauge.
using connection_counts = std::vector<std::pair<std::string, std::size_t>>;

// Every anvil_* metric with its # HELP and # TYPE lines; histograms as cumulative _bucket{le=...}
// series ending with le="+Inf", then _sum and _count.
std::string metrics_text(const engine_stats& s, const connection_counts& connections = {});

}  // namespace anvil::proto
