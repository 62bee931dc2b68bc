// The GPU worker in a build without a GPU backend: never available, and constructing one says why.
#include <stdexcept>

#include "gpu_worker/gpu_worker.h"

namespace anvil::gpu_worker {

struct gpu_worker::impl {};

gpu_worker::gpu_worker(const model::llm&, const gpu_worker_config&) {
  throw std::runtime_error("this build has no GPU backend (configure with -DANVIL_GPU=cuda or -DANVIL_GPU=hip)");
}
gpu_worker::~gpu_worker() = default;
bool gpu_worker::available() { return false; }
const memory_plan& gpu_worker::plan() const { throw std::logic_error("no GPU worker"); }
std::uint64_t gpu_worker::device_allocations() const { return 0; }
void gpu_worker::do_execute(step_plan, boost::asio::any_completion_handler<execute_signature>) {}
void gpu_worker::do_masks(step_masks) {}

}  // namespace anvil::gpu_worker
