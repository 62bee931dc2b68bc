// `anvil generate -m FILE -p TEXT`: loads a model and streams generated text to stdout, on the
// CPU reference path (one sequence; the engine brings batching and the GPU).
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "model/chat_template.h"
#include "model/cpu_forward.h"
#include "model/gguf_tokenizer.h"
#include "model/tokenizer.h"
#include "sampler/sampling.h"

namespace anvil::cli {
namespace {

struct generate_args {
  std::string model;
  std::string prompt;
  std::string system;
  bool chat = false;
  int n_predict = 128;
  int ctx = 0;  // 0: min(model's training context, 4096)
  bool ignore_eos = false;
  sampler::sampling_params sampling;
};

constexpr std::int64_t block_size = 16;
constexpr std::int64_t prefill_chunk = 256;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::int32_t> prompt_tokens(const generate_args& a, const model::gguf_file& f, const model::tokenizer& tok) {
  if (!a.chat) return tok.encode(a.prompt, /*add_special=*/true, /*parse_special=*/true);
  const std::string src = model::chat_template_from_gguf(f);
  if (src.empty()) throw model::model_error("--chat: the model has no tokenizer.chat_template");
  const auto piece = [&](std::int32_t id) { return id >= 0 ? tok.token_piece(id) : std::string(); };
  const model::chat_template tmpl(src, piece(tok.bos()), piece(tok.eos()));
  std::vector<model::chat_message> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  messages.push_back({"user", a.prompt});
  return tok.encode(tmpl.render(messages, /*add_generation_prompt=*/true), /*add_special=*/false, /*parse_special=*/true);
}

int run_generate(const generate_args& a) {
  if (const auto err = sampler::validate(a.sampling)) throw std::invalid_argument(*err);
  if (a.n_predict < 0) throw std::invalid_argument("-n must be >= 0");
  const auto t_load = std::chrono::steady_clock::now();
  model::llm m = model::load_llm(model::gguf_file::open(a.model));
  const model::tokenizer tok(model::tokenizer_spec_from_gguf(m.file));
  if (tok.n_vocab() > m.hp.n_vocab) throw model::model_error("the tokenizer has more tokens than the model's embedding");
  std::fprintf(stderr, "loaded %s (%s, %lld layers, %.2f GB) in %.2f s\n", a.model.c_str(), m.hp.arch_name.c_str(),
               static_cast<long long>(m.hp.n_layer), double(m.weight_bytes()) / 1e9, seconds_since(t_load));

  const std::vector<std::int32_t> prompt = prompt_tokens(a, m.file, tok);
  const std::int64_t ctx = a.ctx > 0 ? a.ctx : std::min<std::int64_t>(m.hp.n_ctx_train, 4096);
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (std::int64_t(prompt.size()) >= ctx) {
    throw std::invalid_argument("the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " + std::to_string(ctx));
  }
  const std::int64_t total = std::min<std::int64_t>(ctx, std::int64_t(prompt.size()) + a.n_predict);
  const std::int64_t n_blocks = (total + block_size - 1) / block_size;
  model::kv_cache_storage cache(m.hp, n_blocks, block_size);
  std::vector<std::int32_t> table(static_cast<std::size_t>(n_blocks));
  for (std::int64_t i = 0; i < n_blocks; ++i) table[std::size_t(i)] = std::int32_t(i);

  model::cpu_forward fwd(m);
  std::vector<float> logits;
  const auto t_prefill = std::chrono::steady_clock::now();
  for (std::int64_t pos = 0; pos < std::int64_t(prompt.size()); pos += prefill_chunk) {
    const std::int64_t n = std::min<std::int64_t>(prefill_chunk, std::int64_t(prompt.size()) - pos);
    const model::forward_seq seq{std::span(prompt).subspan(std::size_t(pos), std::size_t(n)), pos, table, false};
    fwd.run(std::span(&seq, 1), cache, logits);
  }
  const double prefill_s = seconds_since(t_prefill);

  std::vector<std::int32_t> history = prompt;
  std::mt19937_64 rng(a.sampling.seed);
  model::incremental_decoder out(tok);
  const auto t_decode = std::chrono::steady_clock::now();
  int generated = 0;
  std::string finish = "length";
  for (std::int64_t pos = std::int64_t(prompt.size()); pos < total; ++pos) {
    const std::int32_t next = sampler::sample_token(logits, a.sampling, history, rng);
    if (tok.is_eog(next) && !a.ignore_eos) {
      finish = "stop";
      break;
    }
    history.push_back(next);
    ++generated;
    std::fputs(out.push(next).c_str(), stdout);
    std::fflush(stdout);
    if (pos + 1 == total) break;
    const model::forward_seq seq{std::span(&history.back(), 1), pos, table, false};
    fwd.run(std::span(&seq, 1), cache, logits);
  }
  std::fputs(out.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  const double decode_s = seconds_since(t_decode);
  std::fprintf(stderr, "prompt %zu tokens in %.2f s (%.1f tok/s); generated %d tokens in %.2f s (%.1f tok/s); finish: %s\n",
               prompt.size(), prefill_s, double(prompt.size()) / prefill_s, generated, decode_s,
               generated ? double(generated) / decode_s : 0.0, finish.c_str());
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt, streamed to stdout");
  auto a = std::make_shared<generate_args>();
  cmd->add_option("-m,--model", a->model, "GGUF model file")->required();
  cmd->add_option("-p,--prompt", a->prompt, "the prompt")->required();
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate at most")->capture_default_str();
  cmd->add_flag("--chat", a->chat, "wrap the prompt in the model's chat template");
  cmd->add_option("--system", a->system, "system message (with --chat)");
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
  cmd->callback([&exit_code, a] { exit_code = run_generate(*a); });
}

}  // namespace anvil::cli
