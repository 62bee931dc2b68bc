// Option parsing helpers and validation for anvil-bench (see bench_options.h).
#include "bench/load/bench_options.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace anvil::bench {
namespace {

std::optional<double> to_double(const std::string& s) {
  if (s.empty()) return std::nullopt;
  try {
    std::size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::optional<bench_target> parse_target(const std::string& url, std::string& error) {
  bench_target t;
  std::string rest;
  if (url.rfind("tcp://", 0) == 0) {
    t.proto = bench_target::protocol::line;
    rest = url.substr(6);
  } else if (url.rfind("http://", 0) == 0) {
    t.proto = bench_target::protocol::http;
    rest = url.substr(7);
  } else {
    error = "--url must start with tcp:// or http:// (https is not supported), got '" + url + "'";
    return std::nullopt;
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    error = "--url takes no path (use --endpoint), got '" + url + "'";
    return std::nullopt;
  }
  const auto colon = rest.rfind(':');
  t.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (t.host.size() >= 2 && t.host.front() == '[' && t.host.back() == ']') t.host = t.host.substr(1, t.host.size() - 2);
  if (t.host.empty()) {
    error = "--url has no host: '" + url + "'";
    return std::nullopt;
  }
  if (colon == std::string::npos) {
    if (t.proto == bench_target::protocol::line) {
      error = "--url tcp:// needs a port: '" + url + "'";
      return std::nullopt;
    }
    t.port = 80;
    return t;
  }
  const std::string port = rest.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
    error = "--url has a bad port: '" + url + "'";
    return std::nullopt;
  }
  t.port = static_cast<std::uint16_t>(value);
  return t;
}

bool is_chat_endpoint(const std::string& endpoint) { return ends_with(endpoint, "chat/completions"); }

int in_flight_cap(const bench_options& o) { return o.concurrency > 0 ? o.concurrency : o.max_concurrency; }

double effective_rate(const bench_options& o) {
  if (o.concurrency > 0 || !o.request_rate) return std::numeric_limits<double>::infinity();
  return *o.request_rate;
}

std::string validate_options(const bench_options& o) {
  std::string err;
  const auto target = parse_target(o.url, err);
  if (!target) return err;
  const bool http = target->proto == bench_target::protocol::http;
  if (http && (o.endpoint.empty() || o.endpoint.front() != '/')) return "--endpoint must start with '/'";
  if (o.concurrency < 0) return "--concurrency must be >= 1";
  if (o.concurrency > 0 && o.request_rate) return "give --concurrency or --request-rate, not both";
  if (o.concurrency > 0 && o.max_concurrency > 0) return "--max-concurrency goes with --request-rate, not --concurrency";
  if (o.request_rate && !(*o.request_rate > 0)) return "--request-rate must be > 0 (or inf)";
  if (!(o.burstiness > 0) || !std::isfinite(o.burstiness)) return "--burstiness must be > 0";
  if (o.max_concurrency < 0) return "--max-concurrency must be >= 1";
  if (o.num_prompts < 1) return "--num-prompts must be >= 1";
  if (o.input_len < 1) return "--input-len must be >= 1";
  if (o.output_len < 1) return "--output-len must be >= 1";
  if (o.warmup_output_len < 1) return "the warm-up output length must be >= 1";
  if (o.token_min < 0 || o.token_max < o.token_min) return "--token-min/--token-max must satisfy 0 <= min <= max";
  if (o.random_token_ids && !o.dataset.empty()) return "--random-token-ids and --dataset exclude each other";
  if (o.random_token_ids && http && is_chat_endpoint(o.endpoint))
    return "--random-token-ids needs a completions endpoint (chat takes text)";
  if (!(o.timeout_s > 0)) return "--timeout must be > 0";
  if (o.max_duration_s < 0) return "--max-duration must be >= 0 (0: no limit)";
  if (o.percentiles.empty()) return "--percentiles needs at least one value";
  for (double p : o.percentiles)
    if (!(p > 0 && p < 100)) return "--percentiles must be in (0, 100)";
  for (const auto* v : {&o.goodput.ttft_ms, &o.goodput.tpot_ms, &o.goodput.e2el_ms})
    if (*v && !(**v > 0)) return "--goodput values must be > 0 ms";
  return "";
}

std::optional<slo_spec> parse_goodput(const std::vector<std::string>& items, std::string& error) {
  slo_spec s;
  for (const auto& item : items) {
    const auto colon = item.find(':');
    const std::string key = item.substr(0, colon);
    const auto value = colon == std::string::npos ? std::nullopt : to_double(item.substr(colon + 1));
    if (!value || !(*value > 0)) {
      error = "--goodput takes KEY:MS with MS > 0 (keys ttft, tpot, e2el), got '" + item + "'";
      return std::nullopt;
    }
    std::optional<double>* slot = key == "ttft" ? &s.ttft_ms : key == "tpot" ? &s.tpot_ms : key == "e2el" ? &s.e2el_ms : nullptr;
    if (!slot) {
      error = "--goodput: unknown metric '" + key + "' (ttft, tpot or e2el)";
      return std::nullopt;
    }
    if (*slot) {
      error = "--goodput: '" + key + "' given twice";
      return std::nullopt;
    }
    *slot = *value;
  }
  return s;
}

std::optional<std::vector<double>> parse_percentiles(const std::string& text, std::string& error) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto v = to_double(item);
    if (!v || !(*v > 0 && *v < 100)) {
      error = "--percentiles takes numbers in (0, 100) separated by commas, got '" + text + "'";
      return std::nullopt;
    }
    out.push_back(*v);
  }
  if (out.empty()) {
    error = "--percentiles needs at least one value";
    return std::nullopt;
  }
  return out;
}

std::string format_seconds(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::optional<double> parse_rate(const std::string& text, std::string& error) {
  if (text == "inf" || text == "INF" || text == "Inf") return std::numeric_limits<double>::infinity();
  const auto v = to_double(text);
  if (!v || !(*v > 0)) {
    error = "--request-rate takes a number > 0 or 'inf', got '" + text + "'";
    return std::nullopt;
  }
  return v;
}

}  // namespace anvil::bench
