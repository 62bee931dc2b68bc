// `anvil generate [-m FILE] -p TEXT`: one request through the engine (the same path every client
// takes), its text streamed to stdout as it is produced. Without -m it runs the shipped model.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include <boost/asio/use_future.hpp>

#include "engine/engine.h"
#include "cli/backend_args.h"
#include "cli/chat_template_arg.h"
#include "cli/commands.h"
#include "cli/model_arg.h"
#include "model/arch/cpu_forward.h"

namespace anvil::cli {
namespace {

struct generate_args {
  std::string model;
  std::string prompt;
  std::string system;
  bool chat = false;
  std::string chat_template;  // --chat-template FILE
  std::string regex;          // --regex PATTERN: structured output
  std::string grammar_file;   // --grammar-file FILE: structured output (GBNF)
  std::string json_schema;    // --json-schema FILE: structured output
  int n_predict = 128;
  int ctx = 0;  // 0: the model's, at most 4096
  bool ignore_eos = false;
  backend_args engine;  // --backend, --gpu-*, --idle-spin-us
  sampler::sampling_params sampling;
};

// The process's CPU time (every thread), in seconds.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

int run_generate(const generate_args& a) {
  const std::string model_path = model_path_or_default(a.model);
  // A KV pool for exactly one full context.
  const model::hparams hp = model::read_hparams(model::gguf_file::open(model_path));
  const std::int64_t ctx = a.ctx > 0 ? a.ctx : std::min<std::int64_t>(hp.n_ctx_train, 4096);
  engine_config cfg;
  cfg.model_path = model_path;
  cfg.chat_template = read_chat_template_file(a.chat_template);
  cfg.max_model_len = ctx;
  cfg.max_seqs = 1;
  apply_backend_args(a.engine, cfg);
  cfg.kv_budget_bytes = model::kv_cache_storage::bytes_per_block(hp, cfg.block_size, cfg.kv_cache_dtype) *
                        std::size_t(ctx / cfg.block_size + 2);
  cfg.gpu_kv_budget_bytes = cfg.kv_budget_bytes;  // one context is all one request needs
  auto eng = engine::create(cfg);

  generate_request req;
  if (a.chat) {
    if (!a.system.empty()) req.messages.push_back({"system", a.system});
    req.messages.push_back({"user", a.prompt});
  } else {
    req.prompt = a.prompt;
  }
  req.max_tokens = a.n_predict;
  req.sampling = a.sampling;
  req.ignore_eos = a.ignore_eos;
  if (!a.regex.empty()) {
    req.constraint = {.what = structured_output::kind::regex, .spec = a.regex, .field = "--regex"};
  } else if (!a.json_schema.empty() || !a.grammar_file.empty()) {
    const bool schema = !a.json_schema.empty();
    const std::string& file = schema ? a.json_schema : a.grammar_file;
    const std::string option = schema ? "--json-schema" : "--grammar-file";
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error(option + ": cannot read " + file);
    std::ostringstream text;
    text << in.rdbuf();
    req.constraint = {.what = schema ? structured_output::kind::json_schema : structured_output::kind::grammar,
                      .spec = text.str(),
                      .field = option};
  }
  if (const std::string why = eng->explain(req); !why.empty()) throw std::invalid_argument(why);

  // The host's cost of decoding: process CPU time and wall time from the first token to the last.
  struct clocks {
    double cpu = 0;
    std::chrono::steady_clock::time_point wall;
  };
  std::optional<clocks> first;
  clocks end_clocks;
  std::promise<stream_event> last;
  auto submitted = eng->submit(req, [&](const stream_event& e) {
    std::fputs(e.text.c_str(), stdout);
    std::fflush(stdout);
    if (!first && !e.tokens.empty()) first = clocks{process_cpu_seconds(), std::chrono::steady_clock::now()};
    if (e.done) {
      end_clocks = {process_cpu_seconds(), std::chrono::steady_clock::now()};
      last.set_value(e);
    }
  });
  if (!submitted) {
    const std::string why = eng->explain(req);
    eng->async_stop(boost::asio::use_future).get();
    throw std::invalid_argument(why.empty() ? submitted.error().message() : why);
  }
  const stream_event end = last.get_future().get();
  std::fputs("\n", stdout);
  const sched::sched_stats st = eng->stats().sched;
  eng->async_stop(boost::asio::use_future).get();

  const stream_timings& t = end.timings;
  const double decode_s = t.mean_itl_ms * double(end.usage.completion_tokens - 1) / 1e3;
  std::fprintf(stderr, "prompt %lld tokens, first token after %.0f ms; generated %lld tokens (%.1f tok/s); finish: %s%s%s\n",
               static_cast<long long>(end.usage.prompt_tokens), t.ttft_ms,
               static_cast<long long>(end.usage.completion_tokens),
               decode_s > 0 ? double(end.usage.completion_tokens - 1) / decode_s : 0.0, end.finish_reason.c_str(),
               end.error ? ": " : "", end.error ? end.error.message().c_str() : "");
  const std::int64_t decoded = end.usage.completion_tokens - 1;
  if (first && decoded > 0) {
    const double wall = std::chrono::duration<double>(end_clocks.wall - first->wall).count();
    const double cpu = end_clocks.cpu - first->cpu;
    std::fprintf(stderr, "host: %.1f us of CPU per decoded token, %.2f cores busy on average\n", 1e6 * cpu / double(decoded),
                 wall > 0 ? cpu / wall : 0.0);
  }
  if (st.timed_gaps > 0) {
    std::fprintf(stderr, "device: %lld steps (%lld planned ahead), busy %.1f us per step, idle %.1f us between steps\n",
                 static_cast<long long>(st.steps), static_cast<long long>(st.steps_ahead),
                 st.timed_steps > 0 ? st.device_busy_us / double(st.timed_steps) : 0.0,
                 st.device_idle_us / double(st.timed_gaps));
  }
  return end.finish_reason == "error" ? 1 : 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt, streamed to stdout");
  auto a = std::make_shared<generate_args>();
  cmd->add_option("-m,--model", a->model, "GGUF model file (default: the shipped model, see ANVIL_MODEL)");
  cmd->add_option("-p,--prompt", a->prompt, "the prompt")->required();
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate at most")->capture_default_str();
  cmd->add_flag("--chat", a->chat, "wrap the prompt in the model's chat template");
  cmd->add_option("--system", a->system, "system message (with --chat)");
  add_chat_template_option(cmd, a->chat_template);
  cmd->add_option("--regex", a->regex, "structured output: the output must match this regular expression");
  auto* schema = cmd->add_option("--json-schema", a->json_schema, "structured output: the output is JSON valid against this schema file")
      ->excludes("--regex");
  cmd->add_option("--grammar-file", a->grammar_file, "structured output: the output matches this GBNF grammar (llama.cpp's syntax)")
      ->excludes("--regex")
      ->excludes(schema);
  cmd->add_option("--ctx", a->ctx, "context length (default: the model's, at most 4096)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating past end-of-generation tokens");
  cmd->add_option("--temp", a->sampling.temperature, "temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "keep the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", a->sampling.top_p, "nucleus sampling threshold")->capture_default_str();
  cmd->add_option("--min-p", a->sampling.min_p, "drop tokens below min-p times the top probability")->capture_default_str();
  cmd->add_option("--repeat-penalty", a->sampling.repetition_penalty, "repetition penalty")->capture_default_str();
  cmd->add_option("--presence-penalty", a->sampling.presence_penalty, "presence penalty")->capture_default_str();
  cmd->add_option("--frequency-penalty", a->sampling.frequency_penalty, "frequency penalty")->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "sampling seed")->capture_default_str();
  add_backend_options(cmd, a->engine);
  cmd->callback([&exit_code, a] { exit_code = run_generate(*a); });
}

}  // namespace anvil::cli
