// `anvil synth --shape NAME --type T -o FILE`: a random-weight GGUF of a real model's shape.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/progress.h"
#include "model/arch/synth.h"
#include "model/tokenizer/tokenizer_json.h"

namespace anvil::cli {
namespace {

struct synth_args {
  std::string shape = "tiny";
  std::string type = "F16";
  std::string out;
  std::string tokenizer_json;
  std::string tokenizer_config;
  std::uint64_t seed = 1;
  std::optional<std::int64_t> layers;  // else the shape's own count
};

int run_synth(const synth_args& a) {
  const model::synth_shape* shape = model::find_synth_shape(a.shape);
  if (!shape) {
    std::string names;
    for (const auto& s : model::synth_shapes()) names += (names.empty() ? "" : ", ") + s.name;
    throw std::invalid_argument("unknown shape '" + a.shape + "' (known: " + names + ")");
  }
  const auto mix = model::parse_synth_mix(a.type);
  if (!mix) throw std::invalid_argument("unknown type '" + a.type + "' (known: F32, F16, BF16, Q8_0, Q4_0, Q6_K, Q4_K_M, IQ4_XS, MXFP4)");
  model::synth_options opt;
  opt.shape = *shape;
  if (a.layers) {
    if (*a.layers < 1 || *a.layers > shape->n_layer) {
      throw std::invalid_argument("--layers " + std::to_string(*a.layers) + " is outside 1.." +
                                  std::to_string(shape->n_layer) + " (" + a.shape + "'s own count)");
    }
    opt.shape.n_layer = *a.layers;
  }
  opt.mix = *mix;
  opt.seed = a.seed;
  if (!a.tokenizer_json.empty()) {
    opt.tokenizer = model::spec_from_hf_json(a.tokenizer_json, a.tokenizer_config);
    if (!a.tokenizer_config.empty()) opt.chat_template = model::chat_template_from_hf_config(a.tokenizer_config);
  }
  const auto t0 = std::chrono::steady_clock::now();
  progress_bar bar("synth " + a.shape + " " + a.type);
  model::write_synth_model(opt, a.out, [&bar](std::size_t done, std::size_t total) { bar.update(done, total); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "wrote %s in %.1f s\n", a.out.c_str(), s);
  return 0;
}

}  // namespace

void add_synth_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("synth", "write a random-weight GGUF model of a real shape");
  auto a = std::make_shared<synth_args>();
  std::string shapes;
  for (const model::synth_shape& s : model::synth_shapes()) shapes += (shapes.empty() ? "" : ", ") + s.name;
  cmd->add_option("--shape", a->shape, shapes)->capture_default_str();
  cmd->add_option("--type", a->type, "F32, F16, BF16, Q8_0, Q4_0, Q6_K, Q4_K_M, IQ4_XS or MXFP4 (experts; the rest Q8_0)")->capture_default_str();
  cmd->add_option("-o,--output", a->out, "the GGUF file to write")->required();
  cmd->add_option("--tokenizer", a->tokenizer_json, "a Hugging Face tokenizer.json to embed (else a synthetic byte-level one)");
  cmd->add_option("--tokenizer-config", a->tokenizer_config, "its tokenizer_config.json (BOS/EOS, chat template)");
  cmd->add_option("--seed", a->seed, "random seed")->capture_default_str();
  cmd->add_option("--layers", a->layers,
                  "keep only the first N layers (1 up to the shape's count): a real layer's shape and time in a smaller file");
  cmd->callback([&exit_code, a] { exit_code = run_synth(*a); });
}

}  // namespace anvil::cli
