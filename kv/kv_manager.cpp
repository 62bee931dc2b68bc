#include "kv/kv_manager.h"

#include <stdexcept>

#include <boost/system/errc.hpp>
#include <spdlog/logger.h>

namespace anvil::kv {

kv_manager::kv_manager(actors::asio::any_io_executor ex, const kv_config& config, std::size_t mailbox_capacity)
    : strand_actor(std::move(ex), {"kv", mailbox_capacity}), core_(config) {}

actors::outcome<kv_batch_result> kv_manager::run(const kv_batch& batch) {
  kv_batch_result out;
  try {
    out = core_.apply(batch);
  } catch (const std::logic_error& e) {
    log().error("step={} batch refused: {}", batch.step, e.what());
    return boost::system::errc::make_error_code(boost::system::errc::invalid_argument);
  }
#ifndef NDEBUG
  // Debug builds audit the whole pool after every step: free + cached + in use must equal the
  // total, and every refcount must match the tables.
  if (std::string err = core_.check(); !err.empty()) {
    log().error("step={} ledger check failed: {}", batch.step, err);
    return boost::system::errc::make_error_code(boost::system::errc::state_not_recoverable);
  }
#endif
  if (log().should_log(spdlog::level::debug)) {
    std::size_t no_room = 0, copies = 0;
    for (const kv_op_result& r : out.results) {
      no_room += !r.ok && !r.preempted;
      copies += r.copies.size();
    }
    log().debug("step={} ops={} no_room={} cow={} preempted={} free={} cached={} in_use={}", batch.step,
                batch.ops.size(), no_room, copies, out.preempted.size(), out.counts.free, out.counts.cached,
                out.counts.in_use);
  }
  return out;
}

std::string kv_manager::audit() {
  std::string err = core_.check();
  if (!err.empty()) log().error("check failed: {}", err);
  return err;
}

}  // namespace anvil::kv
