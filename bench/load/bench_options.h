// bench_options: everything one anvil-bench run is told, as plain data, and its validation.
// The command line (main.cpp) fills it; run_bench() takes it. Kept free of CLI11 and Asio so that
// tests (and other programs) can build one by hand and check it with validate_options().
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace anvil::bench {

// Service-level objectives for goodput: a completed request counts as "good" when it meets
// every objective that is set.
struct slo_spec {
  std::optional<double> ttft_ms;  // time to first token at most this
  std::optional<double> tpot_ms;  // time per output token (after the first) at most this
  std::optional<double> e2el_ms;  // end-to-end latency at most this

  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

struct bench_options {
  std::string url;                         // tcp://HOST:PORT (line protocol) or http://HOST:PORT (OpenAI API)
  std::string endpoint = "/v1/completions";  // HTTP path; one ending in chat/completions sends messages
  std::string model;                       // model name in HTTP bodies; empty: first id of GET /v1/models
  std::string api_key;                     // HTTP: Bearer token; TCP: {"auth": KEY} first on each connection
  int concurrency = 0;                     // > 0: keep exactly this many requests in flight (closed loop)
  std::optional<double> request_rate;      // requests/s (open loop); unset or inf: all at once
  double burstiness = 1.0;                 // gamma shape of inter-arrival times; 1 = Poisson
  int max_concurrency = 0;                 // > 0: cap on requests in flight under a rate
  int num_prompts = 100;                   // requests in the run (the warm-up not counted)
  int input_len = 256;                     // random prompts: about this many tokens each
  int output_len = 128;                    // tokens asked of every request (max_tokens, ignore_eos)
  bool random_token_ids = false;           // random prompts as token-id arrays: exact input lengths
  int token_min = 10;                      // smallest random token id (inclusive)
  int token_max = 250;                     // largest random token id (inclusive)
  std::string dataset;                     // JSONL file of prompts (overrides random prompts)
  std::uint64_t seed = 0;                  // seeds prompts and arrival times
  slo_spec goodput;                        // SLOs for the goodput figure; none: no goodput
  std::vector<double> percentiles{50, 90, 99};  // percentiles reported for each latency
  std::string result_file;                 // write the vLLM-style JSON result here; empty: don't
  double timeout_s = 600;                  // per request, from send to the final answer
  double max_duration_s = 0;               // whole run; > 0: stop launching and fail the rest when it passes
  int warmup_output_len = 4;               // tokens asked of the warm-up request
  bool progress = true;                    // progress bar on stderr
  bool print_table = true;                 // the result table on stdout
};

// Where the requests go, parsed from bench_options::url.
struct bench_target {
  enum class protocol { line, http };
  protocol proto = protocol::line;  // tcp:// speaks the line protocol, http:// the OpenAI API
  std::string host;                 // host name or address
  std::uint16_t port = 0;           // TCP port
};

// Parses "tcp://HOST:PORT" or "http://HOST:PORT" (a trailing "/" allowed; http defaults to port
// 80). Returns an error message in `error` and nullopt when the url is not one of those.
std::optional<bench_target> parse_target(const std::string& url, std::string& error);

// True when `endpoint` takes chat messages (it ends with "chat/completions").
bool is_chat_endpoint(const std::string& endpoint);

// The effective cap on requests in flight: concurrency, else max_concurrency, else none (0).
int in_flight_cap(const bench_options& o);
// The effective arrival rate in requests/s (infinity: all at once).
double effective_rate(const bench_options& o);

// Every check a run needs before it starts; "" when the options are usable, else one message.
std::string validate_options(const bench_options& o);

// "ttft:500" "tpot:50" "e2el:2000" (any subset, each once, values > 0) into an slo_spec.
std::optional<slo_spec> parse_goodput(const std::vector<std::string>& items, std::string& error);
// "50,90,99" into {50, 90, 99}; each in (0, 100).
std::optional<std::vector<double>> parse_percentiles(const std::string& text, std::string& error);
// Seconds for messages: "0.3 s", "600 s".
std::string format_seconds(double s);

// A request rate: a positive number or "inf".
std::optional<double> parse_rate(const std::string& text, std::string& error);

}  // namespace anvil::bench
