#include "gpu_worker/host_group.h"

#include <algorithm>
#include <string>

namespace anvil::gpu_worker {

class host_group::member final : public model::collectives {
 public:
  member(host_group& g, int r) : g_(g), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return g_.size_; }

  void all_reduce_sum(std::span<float> x) override {
    if (g_.size_ == 1) return;
    g_.reduce_at_[std::size_t(r_)] = x.data();
    g_.arrive_and_wait();  // every rank's vector is published
    // This rank's slice of the elements: the sum in rank order, written into every rank's vector.
    const std::size_t n = x.size(), per = (n + std::size_t(g_.size_) - 1) / std::size_t(g_.size_);
    const std::size_t from = std::min(n, per * std::size_t(r_)), to = std::min(n, from + per);
    for (std::size_t i = from; i < to; ++i) {
      float sum = g_.reduce_at_[0][i];
      for (int q = 1; q < g_.size_; ++q) sum += g_.reduce_at_[std::size_t(q)][i];
      for (int q = 0; q < g_.size_; ++q) g_.reduce_at_[std::size_t(q)][i] = sum;
    }
    g_.arrive_and_wait();  // every slice is summed
  }

  void all_gather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() != mine.size() * std::size_t(g_.size_)) {
      throw std::invalid_argument("all_gather: " + std::to_string(all.size()) + " floats for " + std::to_string(g_.size_) +
                                  " parts of " + std::to_string(mine.size()));
    }
    g_.gather_at_[std::size_t(r_)] = mine.data();
    g_.arrive_and_wait();
    for (int q = 0; q < g_.size_; ++q) std::copy_n(g_.gather_at_[std::size_t(q)], mine.size(), all.data() + q * mine.size());
    g_.arrive_and_wait();  // no rank reuses its part before every rank has read it
  }

 private:
  host_group& g_;
  int r_;
};

host_group::host_group(int size)
    : size_(size), reduce_at_(std::size_t(std::max(size, 1))), gather_at_(std::size_t(std::max(size, 1))),
      barrier_(size) {
  if (size < 1) throw std::invalid_argument("host_group: " + std::to_string(size) + " ranks");
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<member>(*this, r));
}

void host_group::arrive_and_wait() {
  if (!barrier_.arrive_and_wait()) throw collective_aborted();
}

void host_group::abort() { barrier_.abort(); }

void host_group::reset() { barrier_.reset(); }

}  // namespace anvil::gpu_worker
