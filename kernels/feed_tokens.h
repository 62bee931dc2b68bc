// feed_tokens: writes into a step's token ids the tokens the step before drew on the device
// (candidates_record_header::drawn, kernels/candidates.h), so that a step queued while the one
// before still runs feeds them without a trip through the host (gpu_worker: overlapped steps).
//   ids[rows[i]] = drawn of record from[i], or 0 where that record drew nothing (-1)
// A sequence whose draw failed is failed by the sampler when its step is collected and its next
// output is discarded; its row still holds a valid token id, so the step runs as any other.
// feed_tokens_ref() is the definition of the op (CPU); launch_feed_tokens() the GPU kernel.
#pragma once

#include <cstddef>
#include <cstdint>

namespace anvil::kernels {

struct feed_tokens_params {
  std::int32_t* ids = nullptr;          // [tokens] the step's token ids (only rows[] are written)
  const std::int32_t* rows = nullptr;   // [n] rows of ids to write, distinct
  const std::int32_t* from = nullptr;   // [n] the record (output index of the step before) of each
  const void* records = nullptr;        // the step before's candidate records, record_bytes apart
  std::size_t record_bytes = 0;         // candidates_record_bytes(max_k) of that step
  std::int64_t n = 0;                   // rows to write, >= 0
};

// CPU reference.
void feed_tokens_ref(const feed_tokens_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Enqueues the kernel on `stream` (nothing for n = 0); hipErrorInvalidValue for a negative n,
// null pointers, or a record size that is not a whole number of 4-byte words.
hipError_t launch_feed_tokens(const feed_tokens_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
