// `anvil serve -m MODEL`: one process serving the OpenAI-compatible HTTP API and the TCP line
// protocol from one engine. The HTTP port answers at once (/health says "loading" while the
// model loads); the line port opens when the engine is ready. A status line is logged
// periodically; SIGINT/SIGTERM stop accepting work, let accepted requests finish, then exit (a
// second signal exits at once).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <spdlog/logger.h>

#include "engine/engine.h"
#include "actors/log.h"
#include "cli/backend_args.h"
#include "cli/chat_template_arg.h"
#include "cli/commands.h"
#include "cli/model_arg.h"
#include "cli/progress.h"
#include "model/arch/cpu_forward.h"
#include "proto/http_server.h"
#include "proto/line_server.h"

namespace anvil::cli {
namespace {

namespace asio = boost::asio;

struct serve_args {
  std::string model;
  std::string chat_template;   // --chat-template FILE
  std::string host = "127.0.0.1";
  int port = 8080;             // HTTP; 0 picks a free port
  int line_port = 8081;        // TCP line protocol; 0 picks a free port, -1 turns it off
  int ctx = 0;                 // 0: the model's, at most 4096
  int max_seqs = 0;             // 0: the backend's (engine.h: default_max_seqs)
  int max_batch_tokens = 2048;  // engine_config's defaults
  int max_prefill_chunk = 512;
  int max_queue = 1024;
  double kv_cache_mib = 0;     // explicit KV pool size; else from --memory-fraction or the default
  double memory_fraction = 0;  // of the memory available at start-up, for the KV pool
  backend_args engine;  // --backend, --gpu-*, --idle-spin-us
  bool no_prefix_caching = false;
  std::string api_key;
  std::vector<std::string> allowed_origins;  // CORS
  int threads = 0;             // engine threads; 0: 2
  int net_threads = 2;
  int max_connections = 0;     // per server; 0: from the descriptor limit
  double status_interval = 10;
};

std::size_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::size_t(4) << 30;
}

// Reads the model file once with a progress bar, so its pages are resident before requests
// arrive (the worker maps the file; the first request should not pay for the disk).
void warm_model_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  ::lseek(fd, 0, SEEK_SET);
  progress_bar bar("loading model");
  std::vector<char> buf(std::size_t(8) << 20);
  std::size_t done = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) {
    done += std::size_t(n);
    bar.update(done, std::size_t(size));
  }
  bar.update(std::size_t(size), std::size_t(size));
  ::close(fd);
}

engine_config engine_config_for(const serve_args& a) {
  const model::hparams hp = model::read_hparams(model::gguf_file::open(a.model));
  engine_config cfg;
  cfg.model_path = a.model;
  cfg.chat_template = read_chat_template_file(a.chat_template);
  cfg.max_model_len = a.ctx > 0 ? a.ctx : std::min<std::int64_t>(hp.n_ctx_train, 4096);
  cfg.max_seqs = a.max_seqs;
  cfg.max_batch_tokens = a.max_batch_tokens;
  cfg.max_prefill_chunk = a.max_prefill_chunk;
  cfg.max_queue = a.max_queue;
  cfg.prefix_caching = !a.no_prefix_caching;
  cfg.threads = a.threads > 0 ? std::size_t(a.threads) : 2;
  apply_backend_args(a.engine, cfg);
  if (a.kv_cache_mib > 0) cfg.gpu_kv_budget_bytes = std::size_t(a.kv_cache_mib * 1024 * 1024);
  const std::size_t per_block = model::kv_cache_storage::bytes_per_block(hp, cfg.block_size, cfg.kv_cache_dtype);
  const std::size_t per_context = per_block * std::size_t((cfg.max_model_len + cfg.block_size - 1) / cfg.block_size);
  if (a.kv_cache_mib > 0) {
    cfg.kv_budget_bytes = std::size_t(a.kv_cache_mib * 1024 * 1024);
  } else if (a.memory_fraction > 0) {
    cfg.kv_budget_bytes = std::size_t(a.memory_fraction * double(available_memory_bytes()));
  } else {  // room for a quarter of the CPU's sequences at full context, within a quarter of free memory
    const std::int64_t seqs = a.max_seqs > 0 ? a.max_seqs : default_max_seqs(worker_backend::cpu);
    cfg.kv_budget_bytes = std::min(per_context * std::size_t(std::max<std::int64_t>(1, seqs / 4)), available_memory_bytes() / 4);
  }
  // A testing hook, deliberately not a flag: process-level tests make the worker fail or stall
  // chosen steps (gpu_worker/fault_injection.h has the spec).
  if (const char* spec = std::getenv("ANVIL_FAULT_INJECT"); spec && *spec) {
    cfg.test_faults = gpu_worker::parse_fault_injection(spec);
  }
  if (cfg.kv_budget_bytes < per_context) {
    throw std::invalid_argument("the KV cache (" + std::to_string(cfg.kv_budget_bytes >> 20) +
                                " MiB) cannot hold one full context of " + std::to_string(cfg.max_model_len) +
                                " tokens (" + std::to_string(per_context >> 20) + " MiB); raise --kv-cache-mib or lower --ctx");
  }
  return cfg;
}

int run_serve(serve_args a) {
  auto log = log::get("serve");
  a.model = model_path_or_default(a.model);
  if (a.api_key.empty()) {
    if (const char* env = std::getenv("ANVIL_API_KEY")) a.api_key = env;
  }
  if (a.port < 0 || a.port > 65535 || a.line_port < -1 || a.line_port > 65535) {
    throw std::invalid_argument("ports must be in [0, 65535] (--line-port -1 turns the line protocol off)");
  }
  const engine_config cfg = engine_config_for(a);

  asio::io_context io;
  auto work = asio::make_work_guard(io);
  proto::http_server_options hopt;
  hopt.host = a.host;
  hopt.port = std::uint16_t(a.port);
  hopt.api_key = a.api_key;
  hopt.allowed_origins = a.allowed_origins;
  hopt.max_connections = std::size_t(a.max_connections);
  proto::http_server http(io, hopt);
  std::vector<std::thread> net;
  for (int i = 0; i < std::max(1, a.net_threads); ++i) net.emplace_back([&io] { io.run(); });
  log->info("HTTP API on http://{}:{} (loading the model; /health answers 503 until it is ready)", a.host, http.port());

  std::shared_ptr<engine> eng;
  std::unique_ptr<proto::line_server> line;
  try {
    warm_model_file(a.model);
    eng = engine::create(cfg);
    if (a.line_port >= 0) {
      proto::line_server_options lopt;
      lopt.host = a.host;
      lopt.port = std::uint16_t(a.line_port);
      lopt.api_key = a.api_key;
      lopt.max_connections = std::size_t(a.max_connections);
      line = std::make_unique<proto::line_server>(io, eng, lopt);
    }
  } catch (...) {
    http.stop();
    work.reset();
    io.stop();
    for (auto& t : net) t.join();
    throw;
  }
  if (line) http.add_connection_gauge("line", [l = line.get()] { return l->connections(); });
  http.set_engine(eng);
  // Before "ready": a SIGTERM sent once the line is seen must find its handler (and the set's
  // descriptors are all open by then, so a client can count them).
  asio::signal_set signals(io, SIGINT, SIGTERM);
  std::printf("anvil serve: ready: model %s, HTTP on http://%s:%u, line protocol %s%s%s\n", eng->model_name().c_str(),
              a.host.c_str(), unsigned(http.port()), line ? "on tcp://" : "off", line ? a.host.c_str() : "",
              line ? (":" + std::to_string(line->port())).c_str() : "");
  std::fflush(stdout);
  if (!a.api_key.empty()) log->info("an API key is required (every endpoint but /health)");

  // Periodic status line. The timer lives on a strand and only the strand touches it: the engine
  // answers the stats request on its own thread, so the line and the re-arm are posted back here,
  // and shutdown cancels the timer through the strand too.
  auto status_strand = asio::make_strand(io);
  asio::steady_timer status(status_strand);
  struct rates {
    std::uint64_t prompt = 0, generated = 0;
    std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
  };
  auto last = std::make_shared<rates>();
  std::atomic<bool> stopping{false};  // set before the timer is cancelled: a stats answer in flight must not re-arm it
  std::function<void()> tick = [&] {
    status.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(a.status_interval)));
    status.async_wait([&, last](boost::system::error_code ec) {
      if (ec) return;
      eng->async_stats([&, last](error_code sec, engine_stats st) {
        if (sec || stopping) return;
        asio::post(status_strand, [&, last, s = std::move(st)] {
          if (stopping) return;
          const auto now = std::chrono::steady_clock::now();
          const double dt = std::chrono::duration<double>(now - last->at).count();
          const auto prompt = std::uint64_t(s.sched.prompt_tokens), gen = std::uint64_t(s.sched.generated_tokens);
          const auto& k = s.kv.counts;
          log->info("running {}, waiting {}, KV {:.1f}% ({} of {} blocks in use, {} cached), prompt {:.1f} tok/s, "
                    "generation {:.1f} tok/s, preemptions {}{}",
                    s.sched.running, s.sched.waiting, k.total ? 100.0 * double(k.in_use) / double(k.total) : 0.0,
                    k.in_use, k.total, k.cached, double(prompt - last->prompt) / dt, double(gen - last->generated) / dt,
                    s.sched.preemptions, s.healthy ? "" : ", UNHEALTHY");
          *last = rates{prompt, gen, now};
          tick();
        });
      });
    });
  };
  if (a.status_interval > 0) asio::post(status_strand, tick);

  // Stop on SIGINT / SIGTERM: drain, then exit; a second signal exits at once. (The set exists
  // since before "ready": a signal that came in between is delivered to this wait.)
  std::promise<void> stopped;
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    log->info("signal {}: finishing accepted requests, refusing new ones (again to quit now)", sig);
    signals.async_wait([](boost::system::error_code e2, int) {
      if (!e2) std::_Exit(130);
    });
    eng->async_stop([&](error_code) { stopped.set_value(); });
  });
  stopped.get_future().wait();

  // Connections deliver their last answers and close; give slow readers a few seconds.
  stopping = true;
  asio::post(status_strand, [&] { status.cancel(); });
  signals.cancel();
  if (line) line->stop();
  http.stop();
  work.reset();
  for (int i = 0; i < 500 && !io.stopped(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  io.stop();
  for (auto& t : net) t.join();
  log->info("stopped");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("serve", "serve the OpenAI-compatible HTTP API and the TCP line protocol");
  auto a = std::make_shared<serve_args>();
  cmd->add_option("-m,--model", a->model, "GGUF model file (default: the shipped model)");
  cmd->add_option("--host", a->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "HTTP port (0: any free port)")->capture_default_str();
  cmd->add_option("--line-port", a->line_port, "TCP line protocol port (0: any free port, -1: off)")->capture_default_str();
  cmd->add_option("--ctx", a->ctx, "context length: prompt + output tokens (default: the model's, at most 4096)");
  add_chat_template_option(cmd, a->chat_template);
  cmd->add_option("--max-seqs", a->max_seqs, "sequences per step (default: 256 on the GPU, 64 on the CPU)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "tokens per step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-prefill-chunk", a->max_prefill_chunk, "prompt tokens per sequence per step")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-queue", a->max_queue, "waiting requests before new ones are refused (429 / overloaded)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--kv-cache-mib", a->kv_cache_mib, "KV cache size in MiB (default: a quarter of --max-seqs at full context)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--memory-fraction", a->memory_fraction, "fraction of the memory available at start-up for the KV cache")
      ->check(CLI::Range(0.01, 0.99));
  add_backend_options(cmd, a->engine);
  cmd->add_flag("--no-prefix-caching", a->no_prefix_caching, "turn automatic prefix caching off");
  cmd->add_option("--allowed-origins", a->allowed_origins,
                  "browser origins allowed to call the HTTP API (CORS), e.g. https://app.example.com, or * for any")
      ->delimiter(',');
  cmd->add_option("--api-key", a->api_key, "require this key (HTTP: Authorization: Bearer KEY; line: {\"auth\": KEY}); or set ANVIL_API_KEY");
  cmd->add_option("--threads", a->threads, "engine threads (default 2)")->check(CLI::Range(0, 256));
  cmd->add_option("--max-connections", a->max_connections,
                  "open connections per server; past it: 503 / an overloaded line (0: from the descriptor limit)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--net-threads", a->net_threads, "network threads")->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--status-interval", a->status_interval, "seconds between status lines (0: none)")->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->callback([&exit_code, a] { exit_code = run_serve(*a); });
}

}  // namespace anvil::cli
