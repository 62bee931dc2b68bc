// anvil-bench: the load tester. Parses the command line into bench_options and hands it to
// run_bench(); every figure and message comes from there.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/load/run_bench.h"

int main(int argc, char** argv) {
  using namespace anvil::bench;
  CLI::App app{"anvil-bench: load-test anvil's TCP line protocol or any OpenAI-compatible HTTP server"};
  bench_options o;
  std::string rate, percentiles = "50,90,99";
  std::vector<std::string> goodput;
  bool no_progress = false;

  app.add_option("--url", o.url, "tcp://HOST:PORT (anvil line protocol) or http://HOST:PORT (OpenAI API)")->required();
  app.add_option("--endpoint", o.endpoint, "HTTP path: /v1/completions, or /v1/chat/completions for messages")
      ->capture_default_str();
  app.add_option("--model", o.model, "model name sent in HTTP bodies (default: the first of GET /v1/models)");
  app.add_option("--api-key", o.api_key, "HTTP: Authorization: Bearer KEY; TCP: {\"auth\": KEY} on each connection");
  app.add_option("--concurrency", o.concurrency, "keep exactly N requests in flight");
  app.add_option("--request-rate", rate, "requests per second, or inf (default: all at once)");
  app.add_option("--burstiness", o.burstiness, "gamma shape of inter-arrival times (1 = Poisson)")->capture_default_str();
  app.add_option("--max-concurrency", o.max_concurrency, "cap on requests in flight under --request-rate");
  app.add_option("--num-prompts", o.num_prompts, "requests in the run")->capture_default_str();
  app.add_option("--input-len", o.input_len, "random prompts: tokens per prompt (about, as words)")->capture_default_str();
  app.add_option("--output-len", o.output_len, "tokens generated per request (max_tokens + ignore_eos)")->capture_default_str();
  app.add_flag("--random-token-ids", o.random_token_ids, "random prompts as token-id arrays (exact input lengths)");
  app.add_option("--token-min", o.token_min, "smallest random token id")->capture_default_str();
  app.add_option("--token-max", o.token_max, "largest random token id")->capture_default_str();
  app.add_option("--dataset", o.dataset, "JSONL: {\"prompt\": ..., \"output_len\": N} or {\"messages\": [...], ...} per line");
  app.add_option("--seed", o.seed, "seed for prompts and arrival times")->capture_default_str();
  app.add_option("--goodput", goodput, "SLOs for goodput: ttft:MS tpot:MS e2el:MS (any subset)")->expected(1, 3);
  app.add_option("--percentiles", percentiles, "percentiles to report, comma-separated")->capture_default_str();
  app.add_option("--result-file", o.result_file, "write the results as JSON (vLLM's key names)");
  app.add_option("--timeout", o.timeout_s, "seconds a request may take")->capture_default_str();
  app.add_option("--max-duration", o.max_duration_s, "seconds the whole run may take; then the rest fails (0: no limit)");
  app.add_flag("--no-progress", no_progress, "no progress bar on stderr");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::string err;
  if (!rate.empty()) {
    o.request_rate = parse_rate(rate, err);
    if (!o.request_rate) {
      std::fprintf(stderr, "anvil-bench: %s\n", err.c_str());
      return 2;
    }
  }
  const auto slo = parse_goodput(goodput, err);
  const auto pcts = slo ? parse_percentiles(percentiles, err) : std::nullopt;
  if (!slo || !pcts) {
    std::fprintf(stderr, "anvil-bench: %s\n", err.c_str());
    return 2;
  }
  o.goodput = *slo;
  o.percentiles = *pcts;
  o.progress = !no_progress;
  return run_bench(o);
}
