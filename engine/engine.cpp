#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_future.hpp>
#include <spdlog/logger.h>

#include "actors/executor_pool.h"
#include "actors/log.h"
#include "gpu_worker/cpu_worker.h"
#include "gpu_worker/gpu_worker.h"
#include "gpu_worker/kv_plan.h"
#include "kv/kv_manager.h"
#include "model/gguf/gguf_tokenizer.h"
#include "sampler/structured/gbnf.h"
#include "sampler/structured/json_schema.h"
#include "sampler/structured/token_masks.h"
#include "sampler/sampler.h"
#include "sched/scheduler.h"

namespace anvil {

namespace asio = boost::asio;

namespace {

const char* reason_name(sched::finish_reason r) {
  switch (r) {
    case sched::finish_reason::stop: return "stop";
    case sched::finish_reason::length: return "length";
    case sched::finish_reason::cancelled: return "cancelled";
    case sched::finish_reason::failed: return "error";
    case sched::finish_reason::none: break;
  }
  return "";
}

// K candidates per step: enough for the request's top_k and logprobs; the tail draw keeps
// sampling exact beyond them.
std::int32_t candidates_for(const generate_request& r) {
  return std::max({r.sampling.top_k > 0 ? r.sampling.top_k : 64, r.sampling.logprobs, 1});
}

}  // namespace

struct engine::impl {
  struct live_stream {
    request_stream out;
    event_handler on_event;
    std::int64_t prompt_tokens = 0;
    bool finished = false;  // a stop string ended it; later scheduler events are ignored
    std::optional<request_stream::clock::time_point> last_token{};  // for the inter-token histogram
    bool cancel_sent = false;  // the scheduler has its cancel: one per request bounds them (tell_urgent)
    std::vector<std::int32_t> stop_token_ids;  // the request's: their text is not shown
    std::optional<std::int64_t> cached_tokens{};  // at the first admission (a recompute may find others)
  };
  // Sends the scheduler one cancel for a live request (streams strand); later ones are no-ops.
  void cancel_once(std::uint64_t id, live_stream& s);

  engine_config cfg;
  model::llm model;
  model::tokenizer tok;
  std::optional<model::chat_template> chat;
  // Structured output: the vocabulary's byte trie (built by the first constrained request, not at
  // start-up) and the compiled constraints of recent requests by spec, with the masks they have
  // computed (any thread, under the mutex).
  std::shared_ptr<const sampler::structured::vocab_trie> vocab;
  std::mutex constraints_mutex;
  // A constraint that does not compile is kept too (masks null, the error), so a client repeating
  // a pathological pattern does not pay its compilation again.
  struct compiled_constraint {
    std::shared_ptr<const sampler::structured::token_masks> masks;
    std::string error;
  };
  std::map<std::pair<int, std::string>, compiled_constraint> constraints;
  std::deque<std::pair<int, std::string>> constraint_order;  // oldest first, at most 64 kept
  std::shared_ptr<const sampler::structured::token_masks> constraint_for(const structured_output& c, std::string& why);
  // The request's constraint: its own, or its tool calls in the template's syntax when
  // tool_call_required; what = none with `why` set when it cannot be built.
  structured_output constraint_of(const generate_request& r, std::string& why) const;
  std::string chat_unusable;  // why chat requests are refused when `chat` is empty
  model::chat_syntax syntax;  // the template's reasoning and tool-call syntax
  // The control tokens among syntax.markers() (Mistral's [TOOL_CALLS]): an output that is parsed
  // or constrained shows them as text, and constraints may generate them.
  std::vector<std::int32_t> marker_ids;
  // Whether a server splits r's output (engine::output_parser): a chat with tools or reasoning.
  bool parses_output(const generate_request& r) const;
  std::int64_t max_model_len = 0;
  actors::executor_pool pool;
  worker_backend backend = worker_backend::cpu;
  std::unique_ptr<gpu_worker::worker> worker;
  std::unique_ptr<kv::kv_manager> kv;
  std::unique_ptr<sampler::sampler_actor> sampler;
  std::unique_ptr<sched::scheduler> sched;
  asio::strand<asio::any_io_executor> streams;
  std::unordered_map<std::uint64_t, live_stream> live;  // streams strand only
  request_metrics metrics;                              // streams strand only
  std::atomic<std::uint64_t> rejected{0};
  std::string name;
  std::atomic<std::uint64_t> next_id{1};
  std::atomic<bool> accepting{true};
  std::atomic<bool> stopped{false};
  std::shared_ptr<spdlog::logger> log = log::get("engine");

  impl(const engine_config& c, model::llm m, worker_backend b, std::chrono::microseconds idle_spin)
      : cfg(c), model(std::move(m)), tok(model::tokenizer_spec_from_gguf(model.file)), pool("anvil", c.threads, idle_spin),
        backend(b), streams(asio::make_strand(pool.get_executor())) {}

  void on_step_events(std::vector<sched::step_event> events);
  void record(const stream_event& last);
  // The stream's last event. A request the scheduler refused at admission (a full queue) counts
  // as rejected (refused = true), not as finished.
  void finish(std::uint64_t id, live_stream& s, const char* reason, error_code ec, stream_event e = {},
              bool refused = false);
  // Whether the engine can run `r`; `why` names the problem. Its compiled constraint, when it has
  // one, goes to `constraint` (submit hands it to the scheduler).
  error_code check(const generate_request& r, std::string& why,
                   std::shared_ptr<const sampler::structured::token_masks>* constraint = nullptr);
  // The prompt's tokens; on a refusal, `why` (when given) says what is wrong, naming the field.
  boost::system::result<std::vector<std::int32_t>, error_code> prompt_of(const generate_request& r,
                                                                         std::string* why = nullptr) const;
};

std::int64_t default_max_seqs(worker_backend b) { return b == worker_backend::gpu ? 256 : 64; }

std::shared_ptr<engine> engine::create(const engine_config& cfg) {
  if (cfg.idle_spin_us < -1) throw std::invalid_argument("idle_spin_us must be -1 (the backend's default) or >= 0");
  if (cfg.max_seqs < 0) throw std::invalid_argument("max_seqs must be 0 (the backend's default) or >= 1");
  model::llm model = model::load_llm(model::gguf_file::open(cfg.model_path));
  worker_backend backend = cfg.backend;
  std::string gpu_refusal;  // why --backend auto took the CPU on a machine with a GPU
  if (backend == worker_backend::automatic) {
    backend = gpu_worker::gpu_worker::available() ? worker_backend::gpu : worker_backend::cpu;
    if (backend == worker_backend::gpu && !(gpu_refusal = gpu_worker::gpu_unsupported(model.hp)).empty()) {
      backend = worker_backend::cpu;
    }
  }
  if (backend == worker_backend::cpu && cfg.gemm_dtype != kernels::gemm_dtype::f16) {
    throw std::invalid_argument(
        "gemm_dtype fp8 (--gemm-dtype fp8) needs the GPU backend; the CPU backend multiplies in f32");
  }
  if (backend == worker_backend::cpu && cfg.f16_weight_copies) {
    throw std::invalid_argument(
        "f16_weight_copies (--f16-weight-copies) needs the GPU backend; the CPU backend multiplies the weights as stored");
  }
  if (cfg.tensor_parallel < 1) throw std::invalid_argument("tensor_parallel must be >= 1");
  if (backend == worker_backend::cpu && !cfg.devices.empty()) {
    throw std::invalid_argument("--devices names GPUs; the CPU backend runs on none");
  }
  if (!cfg.devices.empty() && cfg.devices.size() != std::size_t(cfg.tensor_parallel)) {
    throw std::invalid_argument("--devices names " + std::to_string(cfg.devices.size()) + " GPUs for --tensor-parallel " +
                                std::to_string(cfg.tensor_parallel) + ": one per rank");
  }
  const std::int64_t max_seqs = cfg.max_seqs > 0 ? cfg.max_seqs : default_max_seqs(backend);
  const std::chrono::microseconds idle_spin(cfg.idle_spin_us >= 0 ? cfg.idle_spin_us
                                            : backend == worker_backend::gpu && !cfg.overlap_steps ? 5000 : 0);
  auto p = std::make_unique<impl>(cfg, std::move(model), backend, idle_spin);
  const auto piece = [&](std::int32_t id) { return id >= 0 ? p->tok.token_piece(id) : std::string(); };
  const std::string tmpl = cfg.chat_template.empty() ? model::chat_template_from_gguf(p->model.file) : cfg.chat_template;
  if (!cfg.chat_template.empty()) {  // the operator's own template: an error in it stops start-up
    p->chat.emplace(tmpl, piece(p->tok.bos()), piece(p->tok.eos()));
  } else if (tmpl.empty()) {
    p->chat_unusable = "the model has no chat template (give one with --chat-template FILE)";
  } else {
    try {  // the model file's: completions still work when it cannot be parsed
      p->chat.emplace(tmpl, piece(p->tok.bos()), piece(p->tok.eos()));
    } catch (const model::model_error& e) {
      p->chat_unusable = std::string("the model's chat template cannot be used (give one with --chat-template FILE): ") + e.what();
      p->log->warn("{}", p->chat_unusable);
    }
  }
  if (!gpu_refusal.empty()) p->log->warn("backend auto: the CPU, as the GPU cannot run this model: {}", gpu_refusal);
  if (p->chat) p->syntax = model::detect_chat_syntax(tmpl);
  for (const std::string_view marker : p->syntax.markers()) {
    const std::vector<std::string>& tokens = p->tok.spec().tokens;
    for (std::int32_t id = 0; id < p->tok.n_vocab(); ++id) {
      if (p->tok.is_control(id) && tokens[std::size_t(id)] == marker) p->marker_ids.push_back(id);
    }
  }
  p->name = std::string(p->model.file.get_string("general.name").value_or(""));
  if (p->name.empty()) p->name = std::filesystem::path(cfg.model_path).filename().string();
  p->max_model_len = cfg.max_model_len > 0 ? cfg.max_model_len : std::min<std::int64_t>(p->model.hp.n_ctx_train, 4096);

  if (p->backend == worker_backend::gpu) {
    gpu_worker::gpu_worker_config wc;
    wc.block_size = cfg.block_size;
    wc.memory_fraction = cfg.gpu_memory_fraction;
    wc.kv_budget_bytes = cfg.gpu_kv_budget_bytes;
    wc.max_batch_tokens = cfg.max_batch_tokens;
    wc.max_seqs = max_seqs;
    wc.max_context = p->max_model_len;
    wc.kv_cache_dtype = cfg.kv_cache_dtype;
    wc.gemm_dtype = cfg.gemm_dtype;
    wc.f16_weight_copies = cfg.f16_weight_copies;
    wc.float_activations = cfg.gpu_float_activations;
    if (!cfg.gpu_graphs) wc.graph_max_batch = 0;
    wc.overlap_kernels = cfg.gpu_overlap_kernels;
    wc.idle_spin = idle_spin;
    wc.window_pool = cfg.window_pool;
    if (!cfg.devices.empty()) wc.device = cfg.devices[0];
    wc.tensor_parallel = cfg.tensor_parallel;
    wc.through_communicator = cfg.tensor_parallel_path;
    if (cfg.tensor_parallel > 1) wc.devices = cfg.devices;
    p->worker = std::make_unique<gpu_worker::gpu_worker>(p->model, wc);
  } else {
    const gpu_worker::cpu_worker_config wc{.block_size = cfg.block_size,
                                           .kv_budget_bytes = cfg.kv_budget_bytes,
                                           .max_batch_tokens = cfg.max_batch_tokens,
                                           .max_seqs = max_seqs,
                                           .kv_cache_dtype = cfg.kv_cache_dtype,
                                           .arena_upstream = cfg.cpu_arena_upstream,
                                           .window_pool = cfg.window_pool,
                                           .tensor_parallel = cfg.tensor_parallel};
    p->worker = std::make_unique<gpu_worker::cpu_worker>(p->model, wc);
  }
  if (cfg.test_faults.any()) {
    p->worker = std::make_unique<gpu_worker::fault_injecting_worker>(std::move(p->worker), cfg.test_faults,
                                                                     p->pool.get_executor());
  }
  const gpu_worker::memory_plan& mem = p->worker->plan();
  // A sequence must fit the pool on its own, or one that outgrows it would be preempted and
  // recompute forever: the context offered is at most what the pool holds.
  if (const std::int64_t pool_positions = mem.n_blocks * mem.block_size; p->max_model_len > pool_positions) {
    p->log->warn("the KV pool holds {} positions, fewer than the context of {}: the context is cut to {}",
                 pool_positions, p->max_model_len, pool_positions);
    p->max_model_len = pool_positions;
  }
  // The same for the window pool: one sequence holds at most its window and a prefill chunk.
  if (mem.n_window_blocks > 0) {
    const std::int64_t chunk = std::min(cfg.max_prefill_chunk, cfg.max_batch_tokens);
    const std::int64_t one = gpu_worker::window_blocks_per_seq(mem.window, chunk, mem.block_size);
    if (mem.n_window_blocks < one) {
      throw std::runtime_error(fmt::format(
          "engine: the sliding layers' pool holds {} blocks, one sequence needs {} (a window of {} and a prefill chunk "
          "of {}): give the KV cache more memory, or run with --no-window-pool",
          mem.n_window_blocks, one, mem.window, chunk));
    }
  }
  // A window pool gives back the blocks a cached prefix would need: prefix caching goes with it.
  // A recurrent state keeps it: a cached prefix resumes from the state snapshot at its end.
  const bool prefix_caching = cfg.prefix_caching && mem.n_window_blocks == 0;
  if (cfg.prefix_caching && !prefix_caching) {
    p->log->info("prefix caching off: the sliding-window layers keep only their last {} positions (window pool off: "
                 "every layer keeps the whole context, prefix caching on)",
                 mem.window);
  }
  if (prefix_caching && mem.n_state_slots > 0) {
    p->log->info("prefix caching with recurrent-state snapshots: {} state slots for {} sequences at once, the rest "
                 "hold the state at the end of cached prompts",
                 mem.n_state_slots, mem.max_seqs);
  }
  p->kv = std::make_unique<kv::kv_manager>(p->pool.get_executor(),
                                           kv::kv_config{.n_blocks = mem.n_blocks,
                                                         .block_size = mem.block_size,
                                                         .prefix_caching = prefix_caching,
                                                         .window = mem.window,
                                                         .n_window_blocks = mem.n_window_blocks,
                                                         .n_state_slots = mem.n_state_slots});
  p->sampler = std::make_unique<sampler::sampler_actor>(p->pool.get_executor());

  sched::sched_config sc;
  sc.max_num_batched_tokens = cfg.max_batch_tokens;
  sc.max_num_seqs = mem.max_seqs;
  sc.max_queue = cfg.max_queue;
  sc.max_model_len = p->max_model_len;
  sc.max_prefill_chunk = std::min(cfg.max_prefill_chunk, cfg.max_batch_tokens);
  sc.block_size = mem.block_size;
  sc.prefix_caching = prefix_caching;
  sc.state_snapshots = prefix_caching && mem.n_state_slots > 0;
  for (std::int32_t id = 0; id < p->tok.n_vocab(); ++id) {
    if (p->tok.is_eog(id)) sc.eog_tokens.push_back(id);
  }
  impl* raw = p.get();
  p->sched = std::make_unique<sched::scheduler>(p->pool.get_executor(), sc, *p->kv, *p->worker, *p->sampler,
                                                [raw](std::vector<sched::step_event> ev) {
                                                  asio::post(raw->streams, [raw, ev = std::move(ev)]() mutable {
                                                    raw->on_step_events(std::move(ev));
                                                  });
                                                },
                                                sched::sched_options{.overlap = cfg.overlap_steps});
  const model::hparams& hp = p->model.hp;
  const std::string experts =
      hp.n_expert > 0 ? fmt::format(", {} experts, {} per token", hp.n_expert, hp.n_expert_used) : std::string();
  p->log->info("engine ready: {} ({}, {} layers{}) on {}, {} KV blocks of {} tokens, context {}", cfg.model_path,
               hp.arch_name, hp.n_layer, experts, mem.device, mem.n_blocks, mem.block_size, p->max_model_len);
  // The last handle may be dropped anywhere, also in a completion handler on one of the engine's
  // own threads: there, stopping would wait for work that needs that very thread, and the pool
  // cannot join itself. Another thread then does the stopping and the joining.
  return std::shared_ptr<engine>(new engine(std::move(p)), [](engine* e) {
    if (!e->impl_->pool.running_in_this_thread()) return delete e;
    std::thread([e] { delete e; }).detach();
  });
}

engine::engine(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

engine::~engine() {
  if (!impl_->stopped) async_stop(asio::use_future).get();
  impl_->pool.join();
}

const model::tokenizer& engine::tokenizer() const { return impl_->tok; }
std::int64_t engine::max_model_len() const { return impl_->max_model_len; }
const model::chat_template* engine::chat_template() const { return impl_->chat ? &*impl_->chat : nullptr; }
const model::chat_syntax& engine::chat_syntax() const { return impl_->syntax; }

bool engine::impl::parses_output(const generate_request& r) const {
  return !r.messages.empty() && chat && (!r.tools_json.empty() || syntax.reasoning());
}

std::optional<model::chat_output_parser> engine::output_parser(const generate_request& r) const {
  const impl& m = *impl_;
  const bool tools = !r.tools_json.empty();
  if (!m.parses_output(r)) return std::nullopt;
  const bool opens_thinking =
      m.syntax.think_tags && model::prompt_opens_thinking(m.chat->render(model::chat_inputs{
                                 .messages = r.messages,
                                 .tools_json = r.tools_json,
                                 .template_kwargs_json = r.chat_template_kwargs_json}));
  return model::chat_output_parser(m.syntax, tools, opens_thinking, r.parallel_tool_calls);
}

std::shared_ptr<const sampler::structured::token_masks> engine::impl::constraint_for(const structured_output& c,
                                                                                   std::string& why) {
  namespace st = sampler::structured;
  if (c.what == structured_output::kind::none) return nullptr;
  const std::pair<int, std::string> key{int(c.what), c.spec};
  const auto field = "`" + (c.field.empty() ? std::string("constraint") : c.field) + "`: ";
  {
    std::lock_guard lock(constraints_mutex);
    if (auto it = constraints.find(key); it != constraints.end()) {
      if (!it->second.masks) why = field + it->second.error;
      return it->second.masks;
    }
  }
  const auto keep = [&](compiled_constraint entry) {
    std::lock_guard lock(constraints_mutex);
    if (constraints.emplace(key, std::move(entry)).second) constraint_order.push_back(key);
    if (constraint_order.size() > 64) {
      constraints.erase(constraint_order.front());
      constraint_order.pop_front();
    }
  };
  try {
    std::shared_ptr<const st::vocab_trie> trie;
    {
      std::lock_guard lock(constraints_mutex);
      if (!vocab) {  // each generable token's bytes; control and unused tokens never
        std::vector<std::string> bytes(std::size_t(tok.n_vocab()));
        std::vector<std::int32_t> eog;
        const model::tokenizer_spec& spec = tok.spec();
        for (std::int32_t id = 0; id < tok.n_vocab(); ++id) {
          if (tok.is_eog(id)) {
            eog.push_back(id);
            continue;
          }
          const std::int32_t type = std::size_t(id) < spec.token_types.size() ? spec.token_types[std::size_t(id)] : 1;
          if (type == 1 || type == 4 || type == 6) bytes[std::size_t(id)] = tok.token_piece(id);  // normal, user-defined, byte
        }
        for (const std::int32_t id : marker_ids) bytes[std::size_t(id)] = tok.token_piece(id);
        vocab = std::make_shared<const st::vocab_trie>(std::move(bytes), std::move(eog));
      }
      trie = vocab;
    }
    st::dfa automaton;
    if (c.what == structured_output::kind::regex) {
      automaton = st::compile_regex(c.spec);
    } else if (c.what == structured_output::kind::json_object) {
      automaton = st::compile_regex(st::json_object_regex());
    } else if (c.what == structured_output::kind::grammar) {
      automaton = st::compile_gbnf(c.spec);
    } else {
      automaton = st::compile_regex(st::json_schema_regex_of(c.spec));
    }
    auto masks = std::make_shared<const st::token_masks>(std::move(automaton), std::move(trie));
    (void)masks->mask(masks->start());  // the first step's mask, before the request is queued
    keep({.masks = masks, .error = {}});
    return masks;
  } catch (const st::structured_error& e) {
    why = field + e.what();
    keep({.masks = nullptr, .error = e.what()});
    return nullptr;
  }
}

structured_output engine::impl::constraint_of(const generate_request& r, std::string& why) const {
  namespace st = sampler::structured;
  if (!r.tool_call_required) return r.constraint;
  if (r.constraint.what != structured_output::kind::none) {
    why = "`tool_choice` \"required\" or a named function cannot be combined with `response_format`, `regex` or `grammar`";
    return {};
  }
  using model::tool_call_syntax;
  st::tool_call_format format{.open = "", .close = "", .args_key = "parameters"};  // Llama 3 JSON: one call
  if (syntax.tools == tool_call_syntax::hermes) {
    format = {.open = "<tool_call>\n", .close = "\n</tool_call>", .args_key = "arguments"};
  } else if (syntax.tools == tool_call_syntax::mistral_json) {
    format = {.open = "", .close = "", .args_key = "arguments", .separator = ", ", .list_open = "[TOOL_CALLS][", .list_close = "]"};
  } else if (syntax.tools == tool_call_syntax::mistral_args) {
    format = {.open = "[TOOL_CALLS]", .close = "", .args_key = "", .separator = "", .args_marker = "[ARGS]"};
  } else if (syntax.tools == tool_call_syntax::harmony) {  // one commentary message per call, addressed to it
    format = {.open = "<|channel|>commentary to=functions.", .close = "", .args_key = "", .separator = "",
              .args_marker = "<|constrain|>json<|message|>"};
  }
  const bool parallel = r.parallel_tool_calls && syntax.tools != tool_call_syntax::llama3_json;
  try {
    return {.what = structured_output::kind::regex,
            .spec = st::tool_calls_regex(r.tools_json, r.tool_call_name, format, parallel),
            .field = "tool_choice"};
  } catch (const st::structured_error& e) {
    why = std::string("`tool_choice`: ") + e.what();
    return {};
  }
}

error_code engine::impl::check(const generate_request& r, std::string& why,
                               std::shared_ptr<const sampler::structured::token_masks>* constraint) {
  if (auto bad = sampler::validate(r.sampling, model.hp.n_vocab)) {
    why = *bad;
  } else if (r.max_tokens < 1) {
    why = "max_tokens must be at least 1";
  } else if (r.min_tokens < 0 || r.min_tokens > r.max_tokens) {
    why = "`min_tokens` must be in [0, max_tokens]";
  } else if (std::any_of(r.stop_token_ids.begin(), r.stop_token_ids.end(),
                         [&](std::int32_t t) { return t < 0 || t >= model.hp.n_vocab; })) {
    why = "`stop_token_ids` must be token ids below the vocabulary size (" + std::to_string(model.hp.n_vocab) + ")";
  } else if (!r.prompt.empty() + !r.messages.empty() + !r.prompt_tokens.empty() != 1) {
    why = "give exactly one of prompt, messages or prompt_tokens";
  } else if (!r.messages.empty() && !chat) {
    why = chat_unusable;
  } else if (r.messages.empty() && (!r.tools_json.empty() || !r.chat_template_kwargs_json.empty())) {
    why = "tools and chat_template_kwargs go with messages";
  } else if (!r.tools_json.empty() && syntax.tools == model::tool_call_syntax::none) {
    why = "`tools`: this model's chat template has no tool-call syntax anvil parses (Hermes/Qwen <tool_call>, "
          "Llama 3 JSON, Mistral [TOOL_CALLS] or gpt-oss's harmony), so its calls could not be returned as tool_calls";
  } else if (const structured_output c = constraint_of(r, why); !why.empty()) {
    // why names the field and the problem
  } else if (auto masks = constraint_for(c, why); c.what != structured_output::kind::none && !masks) {
    // why names the field and the problem
  } else {
    if (constraint) *constraint = std::move(masks);
    return {};
  }
  return make_error_code(errc::invalid_argument);
}

std::string engine::explain(const generate_request& r) const {
  std::string why;
  if (impl_->check(r, why)) return why;
  auto prompt = impl_->prompt_of(r, &why);
  if (!prompt) return why.empty() ? "the prompt is invalid: " + prompt.error().message() : why;
  if (prompt->empty()) return "the prompt is empty";
  if (std::int64_t(prompt->size()) >= impl_->max_model_len) {
    return "the prompt has " + std::to_string(prompt->size()) + " tokens; the context holds " +
           std::to_string(impl_->max_model_len);
  }
  return "";
}

boost::system::result<std::vector<std::int32_t>, error_code> engine::impl::prompt_of(const generate_request& r,
                                                                                  std::string* why) const {
  const auto refuse = [why](std::string message) {
    if (why) *why = std::move(message);
    return make_error_code(errc::invalid_argument);
  };
  if (!r.prompt_tokens.empty()) {
    for (std::size_t i = 0; i < r.prompt_tokens.size(); ++i) {
      const std::int32_t t = r.prompt_tokens[i];
      if (t < 0 || t >= model.hp.n_vocab) {
        return refuse("`prompt` token id " + std::to_string(t) + " (at index " + std::to_string(i) +
                      ") is outside the vocabulary of " + std::to_string(model.hp.n_vocab) + " tokens");
      }
    }
    return r.prompt_tokens;
  }
  if (!r.messages.empty()) {
    if (!chat) return refuse(chat_unusable);
    try {
      return tok.encode(chat->render(model::chat_inputs{.messages = r.messages,
                                                        .add_generation_prompt = true,
                                                        .tools_json = r.tools_json,
                                                        .template_kwargs_json = r.chat_template_kwargs_json}),
                        false, true);
    } catch (const model::model_error& e) {
      return refuse(std::string("`messages` cannot be rendered: ") + e.what());
    }
  }
  return tok.encode(r.prompt, true, true);
}

boost::system::result<std::uint64_t, error_code> engine::submit(generate_request r, event_handler on_event) {
  impl& m = *impl_;
  if (!m.accepting) return make_error_code(errc::stopped);
  if (!m.sched->healthy()) return make_error_code(errc::device_fault);
  std::string why;
  const auto refuse = [&m](error_code ec) {
    ++m.rejected;
    return ec;
  };
  std::shared_ptr<const sampler::structured::token_masks> constraint;
  if (const error_code ec = m.check(r, why, &constraint)) {
    m.log->debug("request refused: {}", why);
    return refuse(ec);
  }
  auto prompt = m.prompt_of(r);
  if (!prompt) return refuse(prompt.error());
  if (prompt->empty()) return refuse(make_error_code(errc::invalid_argument));
  if (std::int64_t(prompt->size()) >= m.max_model_len) return refuse(make_error_code(errc::context_overflow));

  const std::uint64_t id = m.next_id++;
  sched::request req;
  req.id = id;
  req.max_tokens = std::min<std::int64_t>(r.max_tokens, m.max_model_len - std::int64_t(prompt->size()));
  req.prompt = std::move(*prompt);
  req.priority = r.priority;
  req.ignore_eos = r.ignore_eos;
  req.stop_token_ids = r.stop_token_ids;
  req.min_tokens = r.min_tokens;
  req.constraint = std::move(constraint);
  req.logits.temperature = r.sampling.temperature;
  req.logits.repetition_penalty = r.sampling.repetition_penalty;
  req.logits.presence_penalty = r.sampling.presence_penalty;
  req.logits.frequency_penalty = r.sampling.frequency_penalty;
  req.logits.logit_bias = r.sampling.logit_bias;
  req.logits.top_k = candidates_for(r);
  req.logits.seed = r.sampling.seed;
  req.logits.draw = {.on = true, .top_k = r.sampling.top_k, .top_p = r.sampling.top_p, .min_p = r.sampling.min_p};
  const std::int64_t n_prompt = std::int64_t(req.prompt.size());
  sched::submit_options opt{r.sampling, r.sampling.logprobs};

  // Register the stream first, on its strand; only then may the scheduler produce events for it.
  // Markers the output parser reads (or a constraint may write) are shown as text.
  std::vector<std::int32_t> shown;
  if (req.constraint || m.parses_output(r)) shown = m.marker_ids;
  asio::post(m.streams, [&m, id, req = std::move(req), opt, n_prompt, stop = std::move(r.stop), shown = std::move(shown),
                         cb = std::move(on_event), t0 = request_stream::clock::now()]() mutable {
    m.live.emplace(id, impl::live_stream{.out = request_stream(m.tok, std::move(stop), t0, std::move(shown)),
                                         .on_event = std::move(cb),
                                         .prompt_tokens = n_prompt,
                                         .stop_token_ids = req.stop_token_ids});
    ++m.metrics.submitted;
    m.sched->async_submit(std::move(req), opt, asio::bind_executor(m.streams, [&m, id](error_code ec) {
      auto it = m.live.find(id);
      if (ec && it != m.live.end()) m.finish(id, it->second, "error", ec, {}, true);
    }));
  });
  return id;
}

void engine::impl::finish(std::uint64_t id, live_stream& s, const char* reason, error_code ec, stream_event e,
                          bool refused) {
  e.request_id = id;
  e.text += s.out.flush(request_stream::clock::now());
  e.done = true;
  e.finish_reason = reason;
  e.error = ec;
  e.usage = {.prompt_tokens = s.prompt_tokens,
             .completion_tokens = s.out.completion_tokens(),
             .cached_prompt_tokens = s.cached_tokens.value_or(0)};
  e.timings = s.out.timings();
  if (refused) {
    ++rejected;
  } else {
    record(e);
  }
  event_handler cb = std::move(s.on_event);
  live.erase(id);
  if (cb) cb(e);
}

void engine::impl::record(const stream_event& e) {
  const std::string_view r = e.finish_reason;
  ++(r == "stop" ? metrics.finished_stop
     : r == "length" ? metrics.finished_length
     : r == "cancelled" ? metrics.finished_cancelled
                        : metrics.finished_error);
  metrics.prompt_tokens += std::uint64_t(e.usage.prompt_tokens);
  metrics.completion_tokens += std::uint64_t(e.usage.completion_tokens);
  if (e.timings.queue_ms > 0) metrics.queue_ms.observe(e.timings.queue_ms);
  metrics.e2e_ms.observe(e.timings.total_ms);
}

void engine::impl::on_step_events(std::vector<sched::step_event> events) {
  const auto now = request_stream::clock::now();
  for (sched::step_event& ev : events) {
    auto it = live.find(ev.id);
    if (it == live.end()) continue;  // already ended by a stop string
    live_stream& s = it->second;
    if (ev.token < 0 && ev.finish == sched::finish_reason::none) {  // admitted: queue time ends
      if (!s.cached_tokens) s.cached_tokens = std::min(ev.cached_tokens, s.prompt_tokens);
      s.out.mark_first_step(now);
      continue;
    }
    stream_event e;
    e.request_id = ev.id;
    if (ev.token >= 0) {
      if (!s.last_token) {
        metrics.ttft_ms.observe(std::chrono::duration<double, std::milli>(now - s.out.submitted()).count());
      } else {
        metrics.itl_ms.observe(std::chrono::duration<double, std::milli>(now - *s.last_token).count());
      }
      s.last_token = now;
      const bool stop_token = ev.finish == sched::finish_reason::stop &&
                              std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), ev.token) != s.stop_token_ids.end();
      request_stream::piece p = s.out.push(ev.token, now, stop_token);
      e.text = std::move(p.text);
      e.tokens = {ev.token};
      e.logprobs = {ev.logprob};
      e.top_logprobs = {std::move(ev.top_logprobs)};
      if (p.stopped) {
        cancel_once(ev.id, s);
        finish(ev.id, s, "stop", {}, std::move(e));
        continue;
      }
    }
    if (ev.finish != sched::finish_reason::none) {
      finish(ev.id, s, reason_name(ev.finish), ev.error, std::move(e));
    } else if (s.on_event) {
      s.on_event(e);
    }
  }
}

void engine::note_rejected() { ++impl_->rejected; }

void engine::impl::cancel_once(std::uint64_t id, live_stream& s) {
  if (std::exchange(s.cancel_sent, true)) return;
  // Refused only once the scheduler has stopped, and then it holds nothing to cancel.
  if (const error_code ec = sched->cancel(id)) log->debug("req={} cancel not delivered: {}", id, ec.message());
}

void engine::cancel(std::uint64_t request_id) {
  // Through the streams strand, so a cancel can never overtake its own submit on the way to the
  // scheduler (submit forwards from that strand too). A request that has ended needs none.
  impl& m = *impl_;
  asio::post(m.streams, [&m, request_id] {
    if (const auto it = m.live.find(request_id); it != m.live.end()) m.cancel_once(request_id, it->second);
  });
}

void engine::start_generate(generate_request r, actors::reply<completion> done, asio::cancellation_slot slot) {
  auto state = std::make_shared<completion>();
  auto reply = std::make_shared<actors::reply<completion>>(std::move(done));
  auto submitted = submit(std::move(r), [state, reply](const stream_event& e) {
    state->text += e.text;
    state->tokens.insert(state->tokens.end(), e.tokens.begin(), e.tokens.end());
    if (!e.done) return;
    state->request_id = e.request_id;
    state->finish_reason = e.finish_reason;
    state->usage = e.usage;
    state->timings = e.timings;
    (*reply)(e.error, std::move(*state));
  });
  if (!submitted) return (*reply)(submitted.error(), completion{});
  // The slot may fire after the request ended (ids are never reused, so that cancels nothing) or
  // after the engine is gone (the weak reference sees it).
  if (slot.is_connected()) {
    slot.assign([weak = weak_from_this(), id = *submitted](asio::cancellation_type) {
      if (auto self = weak.lock()) self->cancel(id);
    });
  }
}

void engine::start_stop(actors::reply<void> done) {
  impl& m = *impl_;
  m.accepting = false;
  auto reply = std::make_shared<actors::reply<void>>(std::move(done));
  const auto stop_actors = [&m, reply] {
    m.sched->async_stop([&m, reply](error_code) {
      m.sampler->async_stop([&m, reply](error_code) {
        m.kv->async_stop([&m, reply](error_code ec) {
          // Through the streams strand: every event the scheduler produced is delivered first.
          asio::post(m.streams, [&m, reply, ec] {
            m.stopped = true;
            (*reply)(ec);
          });
        });
      });
    });
  };
  // Through the streams strand too, after every accepted submit on its way to the scheduler:
  // those requests were accepted, so the scheduler must have them before it stops taking work.
  asio::post(m.streams, stop_actors);
}

asio::any_io_executor engine::get_executor() const { return impl_->pool.get_executor(); }

engine_stats engine::stats() { return async_stats(asio::use_future).get(); }

void engine::start_stats(actors::reply<engine_stats> done) {
  impl& m = *impl_;
  auto st = std::make_shared<engine_stats>();
  auto reply = std::make_shared<actors::reply<engine_stats>>(std::move(done));
  // Scheduler, then KV manager, then the request metrics on the streams strand.
  m.sched->async_stats([&m, st, reply](error_code ec, sched::sched_stats s) {
    if (ec) return (*reply)(ec, engine_stats{});
    st->sched = s;
    m.kv->async_stats([&m, st, reply](error_code kv_ec, kv::kv_stats k) {
      if (kv_ec) return (*reply)(kv_ec, engine_stats{});
      st->kv = k;
      asio::post(m.streams, [&m, st, reply] {
        st->requests = m.metrics;
        st->requests.rejected = m.rejected.load();
        st->live_requests = std::int64_t(m.live.size());
        st->device_allocations = m.worker->device_allocations();
        st->healthy = m.sched->healthy();
        (*reply)({}, std::move(*st));
      });
    });
  });
}

bool engine::healthy() const { return impl_->sched->healthy(); }
const std::string& engine::model_name() const { return impl_->name; }
worker_backend engine::backend() const { return impl_->backend; }

std::optional<worker_backend> parse_worker_backend(std::string_view name) {
  if (name == "cpu") return worker_backend::cpu;
  if (name == "gpu") return worker_backend::gpu;
  if (name == "auto") return worker_backend::automatic;
  return std::nullopt;
}

std::string_view worker_backend_name(worker_backend b) {
  switch (b) {
    case worker_backend::cpu: return "cpu";
    case worker_backend::gpu: return "gpu";
    case worker_backend::automatic: return "auto";
  }
  return "";
}

}  // namespace anvil
