// The step contract's checks, shared by every worker backend: a plan that breaks them is a caller
// bug, answered with errc::invalid_argument before anything runs.
#pragma once

#include <string>

#include "messages/step.h"
#include "gpu_worker/worker.h"

namespace anvil::gpu_worker {

// Why `plan` breaks the contract for a worker with this memory plan, or "" when it keeps it:
// at least one sequence, at most max_seqs and max_batch_tokens, token ids in the vocabulary (a
// sequence fed from the step before, feed_from >= 0, has one placeholder instead),
// block tables long enough and naming blocks of the pool, top_k >= 1 where candidates are wanted.
std::string check_plan(const step_plan& plan, const memory_plan& mem);

}  // namespace anvil::gpu_worker
