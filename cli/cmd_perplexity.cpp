// `anvil perplexity -m FILE TEXT_FILE`: the model's perplexity over a text file by sliding windows
// (model/perplexity.h has the algorithm, the same as tools/train/make_goldens.py's), on the CPU
// forward pass. The text is tokenised as the model tokenises a prompt (BOS first if it adds one).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <boost/json.hpp>

#include "cli/commands.h"
#include "cli/model_arg.h"
#include "cli/progress.h"
#include "model/gguf_tokenizer.h"
#include "model/perplexity.h"

namespace anvil::cli {
namespace {

struct perplexity_args {
  std::string model;
  std::string file;
  model::perplexity_options opt;
  bool json = false;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) throw std::runtime_error("'" + path + "' is empty: nothing to score");
  return ss.str();
}

int run_perplexity(const perplexity_args& a) {
  const std::string text = read_text(a.file);
  const std::string path = model_path_or_default(a.model);
  const model::llm m = model::load_llm(model::gguf_file::open(path));
  const model::tokenizer tok(model::tokenizer_spec_from_gguf(m.file));
  const std::vector<std::int32_t> ids = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
  if (ids.size() < 2) throw std::runtime_error("'" + a.file + "' is a single token: nothing to score");
  model::perplexity_options opt = a.opt;
  if (opt.ctx <= 0) opt.ctx = m.hp.n_ctx_train;
  if (opt.stride <= 0) opt.stride = std::max<std::int64_t>(opt.ctx / 2, 1);

  progress_bar bar("perplexity", "windows");
  const auto t0 = std::chrono::steady_clock::now();
  const model::perplexity_result r = model::perplexity(m, ids, opt, [&bar](std::int64_t done, std::int64_t total) {
    bar.update(std::size_t(done), std::size_t(total));
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (a.json) {
    const boost::json::object o = {
        {"model", path}, {"file", a.file}, {"tokens", ids.size()}, {"scored", r.n_scored},
        {"windows", r.n_windows}, {"ctx", opt.ctx}, {"stride", opt.stride}, {"nll_sum", r.nll_sum},
        {"mean_nll", r.mean_nll()}, {"perplexity", r.perplexity()}, {"seconds", seconds}};
    std::printf("%s\n", boost::json::serialize(o).c_str());
  } else {
    std::printf("perplexity: %.4f over %lld tokens\n", r.perplexity(), static_cast<long long>(r.n_scored));
    std::printf("mean NLL: %.6f nats/token (%lld tokens in %lld windows of %lld, stride %lld; %.1f s)\n", r.mean_nll(),
                static_cast<long long>(ids.size()), static_cast<long long>(r.n_windows), static_cast<long long>(opt.ctx),
                static_cast<long long>(opt.stride), seconds);
  }
  return 0;
}

}  // namespace

void add_perplexity_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("perplexity", "a model's perplexity over a text file (sliding windows, CPU)");
  auto a = std::make_shared<perplexity_args>();
  cmd->add_option("-m,--model", a->model, "GGUF model file (default: the shipped model)");
  cmd->add_option("file", a->file, "text file to score")->required();
  cmd->add_option("--ctx", a->opt.ctx, "window length in tokens (default: the model's context length)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--stride", a->opt.stride, "tokens between window starts (default: ctx / 2)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", a->opt.batch, "tokens per forward step (default: the whole window)")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", a->json, "print the result as one JSON object");
  cmd->callback([&exit_code, a] { exit_code = run_perplexity(*a); });
}

}  // namespace anvil::cli
