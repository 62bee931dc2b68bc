// kv_core::apply: one kv_batch per scheduler step, ops in order, with preemption.
//
// A reserve marked may_preempt that finds no room releases the batch's victims one by one, in
// the order given (lowest priority first), skipping ones not live, until it fits, the victims run
// out, or the next victim is the sequence being served: the victims after it rank above it, and a
// sequence never takes blocks from one that ranks above it (else a late request could starve an
// earlier one under a long oversubscription). Victims released stay released even if the reserve
// still fails: the scheduler then preempts the served sequence itself (vLLM's loop).
// Every later op of the batch on a released victim — or a fork from one — is answered
// preempted = true, ok = false and does nothing: the scheduler planned it before it knew.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/kv_core.h"

namespace anvil::kv {

namespace {

bool contains(const std::vector<std::uint64_t>& ids, std::uint64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

kv_batch_result kv_core::apply(const kv_batch& batch) {
  kv_batch_result out;
  out.results.reserve(batch.ops.size());
  // Sequences this batch must no longer touch: released victims and forks of them. Stays empty
  // (no allocation) unless something is preempted.
  std::vector<std::uint64_t> gone;
  for (const kv_op& op : batch.ops) out.results.push_back(apply_op(op, batch.victims, out, gone));
  out.counts = ledger();
  out.window_counts = window_ledger();
  out.state_counts = state_ledger();
  return out;
}

kv_op_result kv_core::apply_op(const kv_op& op, const std::vector<std::uint64_t>& victims, kv_batch_result& out,
                               std::vector<std::uint64_t>& gone) {
  kv_op_result r;
  r.seq_id = op.seq_id;
  const bool source_gone = op.op == kv_op::kind::fork && contains(gone, op.fork_from);
  if (source_gone && !contains(gone, op.seq_id)) {
    if (live(op.seq_id)) {
      throw std::logic_error("kv_core::fork seq " + std::to_string(op.seq_id) + ": sequence is already live");
    }
    gone.push_back(op.seq_id);  // the fork never happened: later ops on it are skipped too
  }
  if (source_gone || contains(gone, op.seq_id)) {
    r.ok = false;
    r.preempted = true;
    return r;
  }
  switch (op.op) {
    case kv_op::kind::begin:
      r.cached_tokens = begin(op.seq_id, op.tokens);
      tables_into(op.seq_id, r);
      break;
    case kv_op::kind::reserve:
      reserve_preempting(op, victims, out, gone, r);
      break;
    case kv_op::kind::commit:
      commit(op.seq_id, op.tokens);
      break;
    case kv_op::kind::release:
      release(op.seq_id);
      break;
    case kv_op::kind::fork:
      fork(op.seq_id, op.fork_from);
      tables_into(op.seq_id, r);
      break;
  }
  return r;
}

void kv_core::reserve_preempting(const kv_op& op, const std::vector<std::uint64_t>& victims, kv_batch_result& out,
                                 std::vector<std::uint64_t>& gone, kv_op_result& r) {
  reserve_result rr = reserve(op.seq_id, op.n_tokens, op.snapshot);
  if (!rr.ok && op.may_preempt) {
    // Re-plan after each victim: releasing a fork sibling may also remove a copy-on-write.
    for (std::uint64_t v : victims) {
      if (v == op.seq_id) break;  // the rest rank above the served sequence
      if (!live(v)) continue;
      release(v);
      ++stats_.preemptions;
      out.preempted.push_back(v);
      gone.push_back(v);
      rr = reserve(op.seq_id, op.n_tokens, op.snapshot);
      if (rr.ok) break;
    }
  }
  r.ok = rr.ok;
  r.copies = std::move(rr.copies);
  r.state_from = rr.state_from;
  r.snapshot_slot = rr.snapshot_slot;
  tables_into(op.seq_id, r);
}

void kv_core::tables_into(std::uint64_t seq_id, kv_op_result& r) const {
  const std::span<const block_id> t = block_table(seq_id), w = window_table(seq_id);
  r.block_table.assign(t.begin(), t.end());
  r.window_table.assign(w.begin(), w.end());
  r.state_slot = state_slot(seq_id);
}

}  // namespace anvil::kv
