// engine: the in-process API. It loads a model, starts the actors — scheduler, KV-cache manager,
// sampler, worker — and turns requests into streams of text.
//
//   auto eng = anvil::engine::create(cfg);                 // throws model_error at the edge
//   auto id = eng->submit(req, [](const stream_event& e) { ... });   // streaming
//   completion c = eng->async_generate(req, use_future).get();       // or use_awaitable, a callback
//   eng->cancel(id);  eng->async_stop(use_future).get();             // drains accepted requests
//
// Events of one request arrive in order, on the engine's streams strand; the last has done set,
// with the finish reason, usage and timings. Requests hold only integers and strings.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <memory_resource>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/system/result.hpp>

#include "actors/error.h"
#include "engine/metrics.h"
#include "engine/request_stream.h"
#include "actors/strand_actor.h"
#include "gpu_worker/fault_injection.h"
#include "messages/kv_messages.h"
#include "model/chat/chat_output.h"
#include "model/chat/chat_template.h"
#include "sampler/sampler_core.h"
#include "sampler/sampling.h"
#include "sched/scheduler_core.h"

namespace anvil {

// Where steps run: the CPU reference worker, the GPU worker, or automatic (the GPU when this
// build has a GPU backend and the runtime sees a device, else the CPU).
enum class worker_backend { cpu, gpu, automatic };
std::optional<worker_backend> parse_worker_backend(std::string_view name);  // "cpu", "gpu", "auto"
std::string_view worker_backend_name(worker_backend b);
// Sequences per step when engine_config::max_seqs is 0: 256 on the GPU, whose steps grow faster
// with the batch than their cost does (the KV pool still bounds how many run), 64 on the CPU.
std::int64_t default_max_seqs(worker_backend b);

struct engine_config {
  std::string model_path;
  std::string chat_template;                 // Jinja source overriding the GGUF's (--chat-template FILE); "" = the GGUF's
  worker_backend backend = worker_backend::cpu;
  std::int64_t block_size = 16;              // tokens per KV block
  kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16;  // the KV cache's elements: f16 (exact), int8 or fp8
                                             // with a scale per row (kernels/kv_quant.h); fixed for the engine
  kernels::gemm_dtype gemm_dtype = kernels::gemm_dtype::f16;  // GPU backend: the math of steps of many tokens
                                             // (kernels/gemm_dtype.h); fp8 is refused on the CPU backend
  bool f16_weight_copies = false;            // GPU backend: f16 copies of the quantized weights for long steps
                                             // (gpu_worker_config::f16_weight_copies); refused on the CPU backend
  std::size_t kv_budget_bytes = 64u << 20;   // memory for the KV pool (CPU backend)
  std::pmr::memory_resource* cpu_arena_upstream = nullptr;  // CPU backend: where the worker's arena comes
                                                            // from (cpu_worker_config; null: the heap)
  double gpu_memory_fraction = 0.9;          // GPU backend: the KV pool's share of the device memory free after
                                             // weights and scratch
  std::size_t gpu_kv_budget_bytes = 0;       // GPU backend: a cap on the KV pool, 0: none
  bool gpu_float_activations = false;        // GPU backend: f32 activations in the quantized GEMVs
                                             // (gpu_worker_config::float_activations)
  bool gpu_graphs = true;                    // GPU backend: replay decode steps from captured graphs
  bool gpu_overlap_kernels = true;           // GPU backend: gpu_worker_config::overlap_kernels
  std::int64_t max_batch_tokens = 2048;      // tokens per step
  std::int64_t max_seqs = 0;                 // sequences per step; 0: the backend's (default_max_seqs)
  std::int64_t max_queue = 1024;             // waiting requests before submit answers overloaded
  std::int64_t max_model_len = 0;            // prompt + output tokens; 0: the model's, at most 4096; never
                                             // more than the KV pool holds (a sequence must fit alone)
  std::int64_t max_prefill_chunk = 512;      // prompt tokens per sequence per step (a 512-token prompt in one
                                             // step, not two, is a third off its GPU prefill: GPU_NOTES.md)
  bool prefix_caching = true;
  // Models with sliding-window layers beside global ones (gemma3, gpt-oss): the sliding layers
  // keep only their window in a pool of their own (gpu_worker/kv_plan.h), which needs prefix
  // caching off. Off: every layer keeps the whole context, and prefix caching stays as asked.
  bool window_pool = true;
  // Ranks the model is split over, Megatron-style (model/arch/tensor_parallel.h): on the GPU
  // backend one GPU each, joined by NCCL (gpu_worker/communicator.h); on the CPU backend N ranks of
  // the reference pass in N threads joined by in-process collectives.
  int tensor_parallel = 1;
  // GPU backend, tensor_parallel 1: run the one rank through the split's path (shard,
  // collectives, gathered logits) all the same, to compare with the plain worker.
  bool tensor_parallel_path = false;
  // GPU backend: the devices to run on, by ordinal (`anvil info` lists them), one per rank; empty:
  // 0 .. tensor_parallel - 1.
  std::vector<int> devices;
  std::size_t threads = 2;                   // threads for the CPU-side actors
  // Plan each step while the one before runs on the worker, feeding the tokens the worker drew
  // there (sched/scheduler.h): the worker has the next step queued when one ends. Off: a step is
  // planned once the one before has been sampled. The same tokens either way.
  bool overlap_steps = true;
  // How long an idle actor thread (the CPU-side pool's and the GPU worker's) polls for the next
  // message before it sleeps (actors/executor_pool.h): the hops between actors at the end of
  // each step then cost microseconds, not a wake-up each. -1: 0 (sleep at once) with overlap_steps,
  // where the next step is queued on the worker before the hops start, and with the CPU backend,
  // whose compute needs the cores; 5000 µs (longer than a decode step) with the GPU backend
  // without overlap_steps.
  std::int64_t idle_spin_us = -1;
  // TESTING HOOK, never for production: make the worker fail or stall chosen steps as a broken
  // device would (gpu_worker/fault_injection.h); `anvil serve` sets it from ANVIL_FAULT_INJECT.
  gpu_worker::fault_injection test_faults;
};

// Structured output: the output must match a regular expression, a JSON schema or a GBNF grammar,
// or be a JSON object (sampler/structured/). Decoding is constrained token by token, so it always does (unless
// max_tokens or the context cuts it short: finish_reason "length").
struct structured_output {
  enum class kind { none, regex, json_schema, json_object, grammar };
  kind what = kind::none;
  std::string spec{};   // regex: the pattern; json_schema: the schema as JSON text; grammar: GBNF
  std::string field{};  // the request field it came from, for error messages ("response_format")
};

struct generate_request {
  std::string prompt;                              // raw text (special tokens are recognised), or
  std::vector<model::chat_message> messages;       // a conversation for the model's chat template, or
  std::string tools_json;                          // with messages: the tool definitions (JSON array) the
                                                   // template is given as `tools`; "" = none
  bool tool_call_required = false;                 // with tools: the output is tool calls, constrained to the
                                                   // template's syntax (tool_choice "required" or a function)
  std::string tool_call_name;                      // with tool_call_required: the only function, or "" for any
  bool parallel_tool_calls = true;                 // with tools: several calls may be returned (and, with
                                                   // tool_call_required, follow each other); else the first
  std::string chat_template_kwargs_json;           // with messages: extra template variables (JSON object,
                                                   // e.g. {"enable_thinking": false}); "" = none
  std::vector<std::int32_t> prompt_tokens;         // token ids as they are
  std::int64_t max_tokens = 16;                    // >= 1; cut to what the context leaves
  sampler::sampling_params sampling;               // temperature, top_k/p, min_p, penalties, seed, logprobs, logit_bias
  std::vector<std::string> stop;                   // stop strings: output ends before the first one
  std::int32_t priority = 0;                       // lower runs first
  bool ignore_eos = false;
  std::vector<std::int32_t> stop_token_ids;        // generating one ends the request ("stop"); its text is not shown
  std::int64_t min_tokens = 0;                     // no end-of-generation or stop token before this many tokens
  structured_output constraint;                    // structured output (none by default)
};

struct usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_prompt_tokens = 0;  // of prompt_tokens, those the prefix cache held at admission
};

struct stream_event {
  std::uint64_t request_id = 0;
  std::string text;                                // new text since the previous event
  std::vector<std::int32_t> tokens;                // new tokens
  std::vector<float> logprobs;                     // one per token: log p under the processed distribution
  std::vector<std::vector<sampler::token_logprob>> top_logprobs;  // one per token: the sampling.logprobs most likely
  bool done = false;
  std::string finish_reason;                       // with done: "stop", "length", "cancelled" or "error"
  error_code error;                                // with "error": why
  anvil::usage usage;                              // with done
  stream_timings timings;                          // with done
};

// A whole non-streamed answer.
struct completion {
  std::uint64_t request_id = 0;
  std::string text;
  std::vector<std::int32_t> tokens;
  std::string finish_reason;
  anvil::usage usage;
  stream_timings timings;
};

struct engine_stats {
  sched::sched_stats sched;             // waiting, running, steps, preemptions, token counts
  kv::kv_stats kv;                      // the block ledger and prefix-cache counters
  request_metrics requests;             // counters and latency histograms over every request
  std::int64_t live_requests = 0;       // submitted and not yet ended
  std::uint64_t device_allocations = 0; // device allocations made by the worker since start-up
  bool healthy = true;                  // false once the worker failed a step
};

class engine : public std::enable_shared_from_this<engine> {
 public:
  using event_handler = std::function<void(const stream_event&)>;

  static std::shared_ptr<engine> create(const engine_config& cfg);
  ~engine();

  // Validates and queues a request; `on_event` then receives its stream. Errors (bad parameters,
  // a prompt that does not fit, a full queue, errc::stopped while stopping, errc::device_fault
  // once unhealthy) come back here and nothing is queued.
  boost::system::result<std::uint64_t, error_code> submit(generate_request r, event_handler on_event);
  // Why submit would refuse `r` ("top_p must be in (0, 1]", "the prompt has 9000 tokens; the
  // context holds 4096"), or "" when it would accept it: the message for an error reply.
  std::string explain(const generate_request& r) const;

  // The whole answer at once; completes on the token's executor. Cancellable like any Asio
  // operation: a cancellation slot bound to the token (asio::bind_cancellation_slot, a
  // coroutine's cancellation) cancels the request, which then completes with what it generated
  // so far and finish_reason "cancelled".
  template <class Token>
  auto async_generate(generate_request r, Token&& token) {
    return boost::asio::async_initiate<Token, void(error_code, completion)>(
        [this](auto handler, generate_request req) {
          boost::asio::cancellation_slot slot = boost::asio::get_associated_cancellation_slot(handler);
          start_generate(std::move(req), actors::reply<completion>(std::move(handler), get_executor(), {}), slot);
        },
        token, std::move(r));
  }

  void cancel(std::uint64_t request_id);

  // Counts a request that a server refused before it reached submit (malformed, a parameter out
  // of range), so that stats().requests.rejected counts every refusal wherever it was made.
  void note_rejected();

  // Refuses new requests, lets every accepted one finish, then stops the actors.
  template <class Token>
  auto async_stop(Token&& token) {
    return boost::asio::async_initiate<Token, void(error_code)>(
        [this](auto handler) { start_stop(actors::reply<void>(std::move(handler), get_executor(), {})); }, token);
  }

  engine_stats stats();  // blocking; not from inside a completion handler

  // The same, without blocking: completes on the token's executor.
  template <class Token>
  auto async_stats(Token&& token) {
    return boost::asio::async_initiate<Token, void(error_code, engine_stats)>(
        [this](auto handler) { start_stats(actors::reply<engine_stats>(std::move(handler), get_executor(), {})); },
        token);
  }

  // False once a device fault failed requests. An unhealthy engine has failed every request it
  // held (finish_reason "error", errc::device_fault) and refuses new ones with errc::device_fault.
  bool healthy() const;
  const std::string& model_name() const;  // general.name of the model, else its file name
  worker_backend backend() const;         // where steps run (cpu or gpu, never automatic)
  boost::asio::any_io_executor get_executor() const;  // the engine's own pool
  const model::tokenizer& tokenizer() const;
  std::int64_t max_model_len() const;
  // The model's chat template (what `messages` are rendered with); nullptr when it has none that
  // parses. Lets a server show the tokens a conversation becomes (HTTP /tokenize).
  const model::chat_template* chat_template() const;
  // How the template writes reasoning and tool calls.
  const model::chat_syntax& chat_syntax() const;
  // What a server splits a request's output with (reasoning, content, tool calls as the template
  // writes them): nullopt for prompts, and for chats with neither tools nor a template that writes
  // reasoning (<think> tags, or gpt-oss's harmony channels).
  // Renders the conversation to see whether the prompt opens a <think> block; throws model_error
  // when it cannot be rendered.
  std::optional<model::chat_output_parser> output_parser(const generate_request& r) const;

 private:
  struct impl;
  explicit engine(std::unique_ptr<impl> p);
  void start_generate(generate_request r, actors::reply<completion> done, boost::asio::cancellation_slot slot);
  void start_stop(actors::reply<void> done);
  void start_stats(actors::reply<engine_stats> done);
  std::unique_ptr<impl> impl_;
};

}  // namespace anvil
