// The per-op device times of op_profile.h.
#include "gpu_worker/op_profile.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <spdlog/logger.h>

#include "actors/log.h"

namespace anvil::gpu_worker {

op_profile::~op_profile() {
  for (slot_marks& s : slots_) {
    for (hipEvent_t e : s.events) (void)hipEventDestroy(e);
  }
  if (finished_ > 0) log::get("gpu")->info("op profile at exit ({} steps):\n{}", finished_, report());
}

bool op_profile::requested() {
  const char* v = std::getenv("ANVIL_OP_PROFILE");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

void op_profile::create(std::size_t n_slots, std::size_t max_marks) {
  slots_.resize(n_slots);
  for (slot_marks& s : slots_) {
    s.events.resize(max_marks);
    s.host.resize(max_marks);
    s.ops.resize(max_marks);
    for (hipEvent_t& e : s.events) {
      if (hipEventCreate(&e) != hipSuccess) throw std::runtime_error("gpu worker: op profile events could not be created");
    }
  }
}

void op_profile::start(std::size_t slot, bool decode, std::int64_t tokens) {
  if (!on()) return;
  current_ = &slots_[slot % slots_.size()];
  current_->used = 0;
  current_->overflow = false;
  current_->decode = decode;
  current_->tokens = tokens;
}

void op_profile::mark(const char* op, hipStream_t stream) {
  if (current_ == nullptr) return;  // off, or outside a step (start-up, graph capture)
  slot_marks& s = *current_;
  if (s.used + 1 >= s.events.size()) {  // keep the last event for end()
    s.overflow = true;
    return;
  }
  if (hipEventRecord(s.events[s.used], stream) != hipSuccess) return;
  s.host[s.used] = std::chrono::steady_clock::now();
  s.ops[s.used++] = op;
}

void op_profile::end(hipStream_t stream) {
  if (current_ == nullptr) return;
  slot_marks& s = *current_;
  if (hipEventRecord(s.events[s.used], stream) == hipSuccess) s.host[s.used++] = std::chrono::steady_clock::now();
  current_ = nullptr;
}

void op_profile::finish(std::size_t slot) {
  if (!on()) return;
  slot_marks& s = slots_[slot % slots_.size()];
  if (s.used < 2 || s.overflow) return;
  kind_sum& k = s.decode ? decode_ : mixed_;
  ++k.steps;
  k.tokens += s.tokens;
  for (std::size_t i = 0; i + 1 < s.used; ++i) {
    float ms = 0;
    if (hipEventElapsedTime(&ms, s.events[i], s.events[i + 1]) != hipSuccess) continue;
    op_sum& o = k.ops[s.ops[i]];
    o.ms += double(ms);
    o.host_ms += std::chrono::duration<double, std::milli>(s.host[i + 1] - s.host[i]).count();
    ++o.marks;
    k.ms += double(ms);
  }
  s.used = 0;
  if (++finished_ % report_every == 0) log::get("gpu")->info("op profile ({} steps):\n{}", finished_, report());
}

std::string op_profile::report() const {
  std::string out;
  for (const auto& [name, k] : {std::pair<const char*, const kind_sum&>{"decode-only steps", decode_},
                                std::pair<const char*, const kind_sum&>{"steps with prompt tokens", mixed_}}) {
    if (k.steps == 0) continue;
    out += fmt::format("{}: {} steps, {:.1f} tokens and {:.1f} us per step\n", name, k.steps,
                       double(k.tokens) / double(k.steps), 1e3 * k.ms / double(k.steps));
    std::vector<std::pair<std::string, op_sum>> rows(k.ops.begin(), k.ops.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    out += fmt::format("  {:<26} {:>12} {:>14} {:>7} {:>14}\n", "op", "us per step", "us per launch", "share",
                       "host us/launch");
    for (const auto& [op, s] : rows) {
      const double launches = double(std::max<std::uint64_t>(s.marks, 1));
      out += fmt::format("  {:<26} {:>12.1f} {:>14.2f} {:>6.1f}% {:>14.2f}\n", op, 1e3 * s.ms / double(k.steps),
                         1e3 * s.ms / launches, 100.0 * s.ms / std::max(k.ms, 1e-9), 1e3 * s.host_ms / launches);
    }
  }
  return out;
}

}  // namespace anvil::gpu_worker
