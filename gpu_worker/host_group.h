// host_group: the in-process collectives of N ranks that run in N threads of one process on host
// memory (model::collectives): the CPU worker's tensor-parallel ranks. A collective waits for
// every rank to call it; the all-reduce then sums each slice of the vector on the rank that owns
// the slice, in rank order, and writes the sum into every rank's vector, so every rank ends with
// the same floats. A rank that fails calls abort(): every rank waiting in (or later entering) a
// collective throws collective_aborted instead of waiting for it, until reset().
#pragma once

#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "gpu_worker/abortable_barrier.h"
#include "model/arch/tensor_parallel.h"

namespace anvil::gpu_worker {

struct collective_aborted : std::runtime_error {
  collective_aborted() : std::runtime_error("another rank failed; the collective was abandoned") {}
};

class host_group {
 public:
  explicit host_group(int size);  // size >= 1
  host_group(const host_group&) = delete;
  host_group& operator=(const host_group&) = delete;

  int size() const { return size_; }
  model::collectives& rank(int r) { return *ranks_[std::size_t(r)]; }
  // Makes every collective throw collective_aborted, now and until reset().
  void abort();
  // Ready for the next step's collectives: call only while no rank is inside one.
  void reset();

 private:
  class member;
  void arrive_and_wait();  // the barrier; throws collective_aborted once aborted

  int size_;
  std::vector<std::unique_ptr<model::collectives>> ranks_;
  std::vector<float*> reduce_at_;        // each rank's vector in the all-reduce under way
  std::vector<const float*> gather_at_;  // each rank's part in the all-gather under way
  abortable_barrier barrier_;
};

}  // namespace anvil::gpu_worker
