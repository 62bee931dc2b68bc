// `anvil perplexity -m FILE TEXT_FILE`: the model's perplexity over a text file by sliding windows
// (model/arch/perplexity.h has the algorithm, the same as tools/train/make_goldens.py's), scored by a
// worker — the CPU reference or the GPU (gpu_worker/worker_perplexity.h) — as `--backend` says.
// The text is tokenised as the model tokenises a prompt (BOS first if it adds one).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <boost/json.hpp>

#include "cli/backend_args.h"
#include "cli/commands.h"
#include "cli/model_arg.h"
#include "cli/progress.h"
#include "engine/engine.h"
#include "gpu_worker/cpu_worker.h"
#include "gpu_worker/gpu_worker.h"
#include "gpu_worker/worker_perplexity.h"
#include "model/gguf/gguf_tokenizer.h"
#include "model/arch/cpu_forward.h"
#include "model/arch/perplexity.h"

namespace anvil::cli {
namespace {

struct perplexity_args {
  std::string model;
  std::string file;
  model::perplexity_options opt;
  bool json = false;
  std::string backend = "auto";
  bool gpu_float_activations = false;
  std::string kv_cache_dtype = "f16";
  std::string gemm_dtype = "f16";
  bool f16_weight_copies = false;
  int tensor_parallel = 1;
};

// A worker for one window of `ctx` tokens fed `batch` at a time: a KV pool of one context.
std::unique_ptr<gpu_worker::worker> make_worker(const model::llm& m, const model::perplexity_options& o,
                                                worker_backend backend, const perplexity_args& a) {
  const kernels::gemm_dtype gemm_dtype = gemm_dtype_of(a.gemm_dtype);
  constexpr std::int64_t block_size = 16;
  const std::size_t kv_bytes =
      model::kv_cache_storage::bytes_per_block(m.hp, block_size, o.kv_cache_dtype) * std::size_t(o.ctx / block_size + 2);
  constexpr std::int64_t score_rows = 64;  // logit rows per head launch on the GPU
  if (backend == worker_backend::gpu) {
    gpu_worker::gpu_worker_config wc;
    wc.block_size = block_size;
    wc.kv_budget_bytes = kv_bytes;
    wc.max_batch_tokens = o.batch;
    wc.max_seqs = score_rows;
    wc.max_context = o.ctx;
    wc.float_activations = a.gpu_float_activations;
    wc.kv_cache_dtype = o.kv_cache_dtype;
    wc.gemm_dtype = gemm_dtype;
    wc.f16_weight_copies = a.f16_weight_copies;
    wc.tensor_parallel = a.tensor_parallel;
    return std::make_unique<gpu_worker::gpu_worker>(m, wc);
  }
  if (gemm_dtype != kernels::gemm_dtype::f16) throw std::invalid_argument("--gemm-dtype fp8 needs the GPU backend");
  if (a.f16_weight_copies) throw std::invalid_argument("--f16-weight-copies needs the GPU backend");
  return std::make_unique<gpu_worker::cpu_worker>(m, gpu_worker::cpu_worker_config{
      .block_size = block_size, .kv_budget_bytes = kv_bytes, .max_batch_tokens = o.batch, .max_seqs = 1,
      .kv_cache_dtype = o.kv_cache_dtype, .tensor_parallel = a.tensor_parallel});
}

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
  model::perplexity_options given = a.opt;
  if (given.batch == 0) given.batch = 512;  // chunks of a long window: the worker's scratch stays small
  given.kv_cache_dtype = kv_cache_dtype_of(a.kv_cache_dtype);
  const model::perplexity_options opt = model::resolve_perplexity_options(given, m.hp.n_ctx_train);
  worker_backend backend = parse_worker_backend(a.backend).value_or(worker_backend::automatic);
  if (backend == worker_backend::automatic) {
    backend = gpu_worker::gpu_worker::available() ? worker_backend::gpu : worker_backend::cpu;
  }
  const kernels::gemm_dtype gemm_dtype = gemm_dtype_of(a.gemm_dtype);
  const std::unique_ptr<gpu_worker::worker> w = make_worker(m, opt, backend, a);

  progress_bar bar("perplexity", "windows");
  const auto t0 = std::chrono::steady_clock::now();
  const model::perplexity_result r =
      gpu_worker::perplexity(*w, ids, opt, m.hp.n_ctx_train, [&bar](std::int64_t done, std::int64_t total) {
        bar.update(std::size_t(done), std::size_t(total));
      });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (a.json) {
    const boost::json::object o = {
        {"model", path}, {"file", a.file}, {"backend", worker_backend_name(backend)}, {"tokens", ids.size()}, {"scored", r.n_scored},
        {"windows", r.n_windows}, {"kv_cache_dtype", kernels::kv_dtype_name(opt.kv_cache_dtype)},
        {"gemm_dtype", kernels::gemm_dtype_name(gemm_dtype)}, {"f16_weight_copies", a.f16_weight_copies}, {"ctx", opt.ctx},
        {"stride", opt.stride}, {"nll_sum", r.nll_sum},
        {"mean_nll", r.mean_nll()}, {"perplexity", r.perplexity()}, {"seconds", seconds}};
    std::printf("%s\n", boost::json::serialize(o).c_str());
  } else {
    std::printf("perplexity: %.4f over %lld tokens\n", r.perplexity(), static_cast<long long>(r.n_scored));
    std::printf("mean NLL: %.6f nats/token (%lld tokens in %lld windows of %lld, stride %lld; %s, %.1f s)\n", r.mean_nll(),
                static_cast<long long>(ids.size()), static_cast<long long>(r.n_windows), static_cast<long long>(opt.ctx),
                static_cast<long long>(opt.stride), std::string(worker_backend_name(backend)).c_str(), seconds);
  }
  return 0;
}

}  // namespace

void add_perplexity_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("perplexity", "a model's perplexity over a text file (sliding windows, on the CPU or the GPU)");
  auto a = std::make_shared<perplexity_args>();
  cmd->add_option("-m,--model", a->model, "GGUF model file (default: the shipped model)");
  cmd->add_option("file", a->file, "text file to score")->required();
  cmd->add_option("--ctx", a->opt.ctx, "window length in tokens (default: the model's context length)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--stride", a->opt.stride, "tokens between window starts (default: ctx / 2)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", a->opt.batch, "tokens per forward step (default: 512, or the whole window when shorter)")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", a->json, "print the result as one JSON object");
  cmd->add_option("--backend", a->backend, "where windows run: cpu, gpu, or auto (the GPU when there is one)")
      ->capture_default_str()->check(CLI::IsMember({"cpu", "gpu", "auto"}));
  cmd->add_flag("--gpu-float-activations", a->gpu_float_activations,
                "GPU: f32 activations in the quantized GEMVs (as the CPU computes) instead of 8-bit");
  add_kv_cache_dtype_option(cmd, a->kv_cache_dtype);
  add_gemm_dtype_option(cmd, a->gemm_dtype);
  add_f16_weight_copies_option(cmd, a->f16_weight_copies);
  add_tensor_parallel_option(cmd, a->tensor_parallel);
  cmd->callback([&exit_code, a] { exit_code = run_perplexity(*a); });
}

}  // namespace anvil::cli
