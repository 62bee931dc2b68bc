// Randomized, seeded, deterministic: thousands of begin / step (reserve, write, commit) / release
// / fork batches over a small pool, with preemption, shared prompts and forks (state slots:
// no forks, and each step's slot must hold its own sequence's state up to where it starts). After every batch
// check() must pass and every live sequence must read back, through a fake physical pool that
// applies the copy-on-write copies and the writes exactly as the worker would, the KV of exactly
// its own tokens. The run also asserts it exercised what it is meant to (hits, evictions,
// copies, no-room answers, preemptions), so it cannot pass by doing nothing.
#include <algorithm>
#include <map>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using namespace testing;

// A hash with five values: collisions everywhere, so exactness rests on the stored tokens.
std::uint64_t weak_hash(std::uint64_t parent, std::span<const std::int32_t> tokens) {
  std::uint64_t h = parent;
  for (std::int32_t t : tokens) h += static_cast<std::uint32_t>(t);
  return h % 5;
}

// A hash blind to the chain: equal blocks after different prefixes share a key, so only the
// parent check keeps a block computed after one prefix from serving another.
std::uint64_t chainless_hash(std::uint64_t, std::span<const std::int32_t> tokens) {
  return default_block_hash(root_hash, tokens);
}

struct stress_config {
  std::string name;
  kv_config kv;
  block_hasher hasher = default_block_hash;
  std::uint64_t seed = 0;
};

void PrintTo(const stress_config& c, std::ostream* os) { *os << c.name; }

struct model_seq {
  std::vector<std::int32_t> tokens;  // prompt, then generated tokens
  std::int64_t computed = 0;
};

class stress_run {
 public:
  explicit stress_run(const stress_config& c)
      : core_(c.kv, c.hasher),
        kv_(c.kv.n_blocks, c.kv.block_size),
        window_kv_(std::max<std::int64_t>(c.kv.n_window_blocks, 1), c.kv.block_size),
        rng_(c.seed),
        bs_(c.kv.block_size),
        window_(c.kv.window),
        forks_(c.kv.n_state_slots == 0),
        snapshots_(c.kv.n_state_slots > 0 && c.kv.prefix_caching),
        slot_state_(static_cast<std::size_t>(c.kv.n_state_slots)) {
    // Shared "system prompts" of 0 to 3 blocks and odd lengths; prompt tails use four token
    // values, so whole identical prompts recur too.
    for (std::int64_t len : {std::int64_t{0}, bs_, 2 * bs_ + 1, 3 * bs_}) {
      system_.push_back(iota_tokens(static_cast<std::size_t>(len), static_cast<std::int32_t>(1000 * (system_.size() + 1))));
    }
  }

  void run(int n_ops) {
    for (int i = 0; i < n_ops && !::testing::Test::HasFailure(); ++i) {
      const auto live = static_cast<std::int64_t>(model_.size());
      const std::uint64_t dice = rng_() % 12;
      if (live == 0 || (live < max_live && dice < 2)) {
        begin();
      } else if (live >= max_live || dice < 3) {
        release(pick());
      } else if (dice < 4 && forks_) {  // sequences with state slots are never forked
        fork(pick());
      } else {
        step();
      }
      verify_all(i);
    }
  }

  const kv_core& core() const { return core_; }
  std::int64_t copies = 0, window_copies = 0, no_room = 0;
  std::int64_t given_back = 0;  // window entries seen given back (-1), over all checks
  std::int64_t fresh_states = 0;  // steps that started a slot's state afresh (state slots)
  std::int64_t resumed_states = 0;  // steps that continued a prefix's snapshot (state slots with prefix caching)

 private:
  static constexpr std::int64_t max_live = 10;

  static kv_batch batch_of(kv_op op) {
    kv_batch b;
    b.ops.push_back(std::move(op));
    return b;
  }
  std::uint64_t pick() {
    auto it = model_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % model_.size()));
    return it->first;
  }

  void begin() {
    auto prompt = system_[rng_() % system_.size()];
    const std::int64_t tail = 1 + static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(2 * bs_));
    for (std::int64_t i = 0; i < tail; ++i) prompt.push_back(static_cast<std::int32_t>(rng_() % 4));
    const std::uint64_t id = next_id_++;
    const kv_batch_result r = apply_checked(batch_of(op_begin(id, prompt)));
    const std::int64_t cached = r.results[0].cached_tokens;
    EXPECT_EQ(cached % bs_, 0);
    EXPECT_LE(cached, static_cast<std::int64_t>(prompt.size()) - 1) << "the last prompt token is always computed";
    model_[id] = {prompt, cached};
  }

  void release(std::uint64_t id) {
    EXPECT_TRUE(apply_checked(batch_of(op_release(id))).results[0].ok);
    model_.erase(id);
  }

  void fork(std::uint64_t from) {
    const std::uint64_t id = next_id_++;
    const kv_batch_result r = apply_checked(batch_of(op_fork(id, from)));
    const auto source = table_of(core_, from);
    const auto shared = static_cast<std::size_t>((core_.computed(from) + bs_ - 1) / bs_);
    EXPECT_EQ(r.results[0].block_table, std::vector<block_id>(source.begin(), source.begin() + shared));
    model_[id] = forked(model_.at(from));
  }

  // A fork keeps only what its source computed and samples its own continuation from there, so
  // it diverges at once (even mid-prompt): a write landing in the wrong block shows.
  static model_seq forked(const model_seq& s) {
    return {{s.tokens.begin(), s.tokens.begin() + s.computed}, s.computed};
  }

  // One scheduler step: reserves for a few sequences (maybe allowed to preempt, with every live
  // sequence as a possible victim), sometimes a release or a fork in the same batch; then the
  // worker copies and writes; then the commits.
  void step() {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, s] : model_) ids.push_back(id);
    std::shuffle(ids.begin(), ids.end(), rng_);
    kv_batch b;
    const std::size_t k = std::min<std::size_t>(ids.size(), 1 + rng_() % 4);
    std::map<std::uint64_t, std::int64_t> target;  // tokens each step computes up to
    for (std::size_t i = 0; i < k; ++i) {
      model_seq& s = model_[ids[i]];
      if (s.computed == static_cast<std::int64_t>(s.tokens.size())) {
        s.tokens.push_back(static_cast<std::int32_t>(1000000 + rng_() % 1000000));  // "sampled"
      }
      const std::int64_t chunk = 1 + static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(2 * bs_));
      std::int64_t n = std::min(s.computed + chunk, static_cast<std::int64_t>(s.tokens.size()));
      std::int64_t ahead = rng_() % 3 == 0 ? static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(bs_)) : 0;
      // A snapshot of the state after the step: it ends at a block boundary, reserved exactly.
      const bool snapshot = snapshots_ && rng_() % 2 == 0 && n / bs_ * bs_ > s.computed;
      if (snapshot) {
        n = n / bs_ * bs_;
        ahead = 0;
      }
      target[ids[i]] = n;
      b.ops.push_back(op_reserve(ids[i], n + ahead, rng_() % 3 == 0, snapshot));
    }
    // A fork before the release, so it never forks a sequence this batch released on purpose
    // (that would be a caller bug); forking one a reserve preempted is fine: it is skipped.
    if (forks_ && rng_() % 4 == 0 && static_cast<std::int64_t>(model_.size()) < max_live) {
      b.ops.push_back(op_fork(next_id_++, ids[rng_() % ids.size()]));
    }
    if (rng_() % 4 == 0) b.ops.push_back(op_release(ids[rng_() % ids.size()]));
    b.victims = ids;
    std::shuffle(b.victims.begin(), b.victims.end(), rng_);
    const kv_batch_result r = apply_checked(b);
    if (::testing::Test::HasFailure()) return;

    std::vector<std::uint64_t> writers;
    std::map<std::uint64_t, std::int32_t> snapshot_into;
    for (std::size_t i = 0; i < b.ops.size(); ++i) {
      const kv_op& op = b.ops[i];
      const kv_op_result& res = r.results[i];
      if (!res.ok) continue;
      if (op.op == kv_op::kind::reserve) {
        kv_.copy(res.copies);  // in op order, before any write: as the worker does
        window_kv_.copy(res.copies, true);
        for (const auto& c : res.copies) (c.window ? window_copies : copies) += 1;
        if (res.state_from >= 0) {  // a snapshot into the sequence's slot, before the step
          slot_state_.at(static_cast<std::size_t>(res.state_slot)) = slot_state_.at(static_cast<std::size_t>(res.state_from));
          ++resumed_states;
        }
        if (res.snapshot_slot >= 0) snapshot_into[op.seq_id] = res.snapshot_slot;
        writers.push_back(op.seq_id);
      } else if (op.op == kv_op::kind::release) {
        model_.erase(op.seq_id);
      } else if (op.op == kv_op::kind::fork) {
        model_[op.seq_id] = forked(model_.at(op.fork_from));
      }
    }
    for (const kv_op_result& res : r.results) no_room += !res.ok && !res.preempted;
    for (std::uint64_t v : r.preempted) model_.erase(v);

    kv_batch commits;
    for (std::uint64_t id : writers) {
      if (!model_.contains(id)) continue;  // preempted (or released) later in the batch
      const model_seq& s = model_.at(id);
      const std::span<const std::int32_t> done(s.tokens.data(), static_cast<std::size_t>(target.at(id)));
      kv_.write(core_.block_table(id), s.computed, done);
      if (window_ > 0) window_kv_.write(core_.window_table(id), s.computed, done);
      if (!slot_state_.empty()) advance_state(id, done);
      if (const auto snap = snapshot_into.find(id); snap != snapshot_into.end()) {  // after the step
        slot_state_.at(static_cast<std::size_t>(snap->second)) = slot_state_.at(static_cast<std::size_t>(core_.state_slot(id)));
      }
      commits.ops.push_back(op_commit(id, {done.begin(), done.end()}));
    }
    apply_checked(commits);
    for (const kv_op& op : commits.ops) model_.at(op.seq_id).computed = static_cast<std::int64_t>(op.tokens.size());
  }

  // The worker's view of a state slot: the fingerprint of the tokens folded into it and their
  // count. A step starts it afresh at position 0, or continues it: then it must hold exactly the
  // sequence's tokens so far — its own last step's, or a snapshot of the same prefix copied in.
  struct slot_state {
    std::uint64_t fp = 0;
    std::int64_t positions = 0;
  };
  void advance_state(std::uint64_t id, std::span<const std::int32_t> done) {
    const std::int32_t slot = core_.state_slot(id);
    ASSERT_GE(slot, 0) << "seq " << id << " runs a step without a state slot";
    slot_state& st = slot_state_.at(static_cast<std::size_t>(slot));
    const std::int64_t from = model_.at(id).computed;
    std::uint64_t fp = 0;
    for (std::int64_t p = 0; p < from; ++p) fp = fake_kv_pool::extend(fp, done[static_cast<std::size_t>(p)]);
    if (from == 0) {
      st = {};
      ++fresh_states;
    }
    ASSERT_EQ(st.positions, from) << "slot " << slot << " of seq " << id;
    ASSERT_EQ(st.fp, fp) << "slot " << slot << " of seq " << id << " holds the state of other tokens";
    for (std::size_t p = static_cast<std::size_t>(from); p < done.size(); ++p) st.fp = fake_kv_pool::extend(st.fp, done[p]);
    st.positions = static_cast<std::int64_t>(done.size());
  }

  kv_batch_result apply_checked(const kv_batch& b) {
    kv_batch_result r = core_.apply(b);
    EXPECT_EQ(r.results.size(), b.ops.size());
    return r;
  }

  void verify_all(int op_index) {
    const std::string err = core_.check();
    ASSERT_EQ(err, "") << "after op " << op_index;
    ASSERT_EQ(core_.live_count(), static_cast<std::int64_t>(model_.size())) << "after op " << op_index;
    for (const auto& [id, s] : model_) {
      ASSERT_TRUE(core_.live(id)) << "seq " << id << " after op " << op_index;
      ASSERT_EQ(core_.computed(id), s.computed) << "seq " << id << " after op " << op_index;
      ASSERT_EQ(kv_.verify(core_.block_table(id), s.tokens, s.computed), "") << "seq " << id << " after op " << op_index;
      if (window_ > 0) {
        // What the next query sees: the window before position `computed`.
        const std::int64_t first = std::max<std::int64_t>(0, s.computed - window_ + 1);
        ASSERT_EQ(window_kv_.verify(core_.window_table(id), s.tokens, s.computed, first), "")
            << "seq " << id << " (window) after op " << op_index;
        for (const block_id b : core_.window_table(id)) given_back += b == no_block;
      }
    }
  }

  kv_core core_;
  fake_kv_pool kv_, window_kv_;
  std::mt19937_64 rng_;
  std::int64_t bs_, window_;
  bool forks_, snapshots_;
  std::vector<slot_state> slot_state_;
  std::vector<std::vector<std::int32_t>> system_;
  std::map<std::uint64_t, model_seq> model_;  // ordered: iteration (and so the run) is deterministic
  std::uint64_t next_id_ = 1;
};

struct KvStress : ::testing::TestWithParam<stress_config> {};

TEST_P(KvStress, RandomOpsKeepEveryInvariantAndEverySequenceReadsItsOwnKv) {
  stress_run run(GetParam());
  run.run(4000);
  ASSERT_FALSE(HasFailure());
  const kv_stats s = run.core().stats();
  if (GetParam().kv.prefix_caching) {
    EXPECT_GT(s.prefix_hits, 0);
    EXPECT_GT(s.evictions, 0);
  } else {
    EXPECT_EQ(s.prefix_hits, 0);
    EXPECT_EQ(s.counts.cached, 0);
  }
  // With one-token blocks every computed block is full: a fork never shares a block it writes.
  // (Sequences with state slots are never forked, and without prefix caching nothing is shared.)
  if (GetParam().kv.block_size > 1 && GetParam().kv.n_state_slots == 0) {
    EXPECT_GT(run.copies, 0);
  }
  EXPECT_GT(run.no_room, 0);
  EXPECT_GT(s.preemptions, 0);
  if (GetParam().kv.window > 0) {
    EXPECT_GT(run.given_back, 0) << "no window block ever left a window";
    if (GetParam().kv.block_size > 1) {
      EXPECT_GT(run.window_copies, 0);
    }
  } else {
    EXPECT_EQ(run.window_copies, 0);
    EXPECT_EQ(s.window_counts.total, 0);
  }
  if (GetParam().kv.n_state_slots > 0) {
    EXPECT_GT(run.fresh_states, 0);
    EXPECT_EQ(s.state_counts.total, GetParam().kv.n_state_slots);
    if (GetParam().kv.prefix_caching) {
      EXPECT_GT(s.state_snapshots, 0);
      EXPECT_GT(run.resumed_states, 0) << "no sequence ever resumed from a snapshot";
      EXPECT_GT(s.prefix_state_misses, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, KvStress,
    ::testing::Values(stress_config{"block4", {24, 4, true}, default_block_hash, 1},
                      stress_config{"block1", {64, 1, true}, default_block_hash, 2},
                      stress_config{"block16", {24, 16, true}, default_block_hash, 3},
                      stress_config{"no_prefix_caching", {24, 4, false}, default_block_hash, 4},
                      stress_config{"colliding_hash", {24, 4, true}, weak_hash, 5},
                      stress_config{"chainless_hash", {24, 2, true}, chainless_hash, 6},
                      // A window pool beside the main one, smaller than it (no room comes from either).
                      stress_config{"window", {.n_blocks = 24, .block_size = 4, .prefix_caching = false, .window = 6,
                                               .n_window_blocks = 14},
                                    default_block_hash, 7},
                      stress_config{"window_block1", {.n_blocks = 64, .block_size = 1, .prefix_caching = false,
                                                      .window = 5, .n_window_blocks = 30},
                                    default_block_hash, 8},
                      stress_config{"window_of_one", {.n_blocks = 24, .block_size = 4, .prefix_caching = false,
                                                      .window = 1, .n_window_blocks = 12},
                                    default_block_hash, 9},
                      // State slots fewer than the live sequences (no room comes from them too).
                      stress_config{"state_slots", {.n_blocks = 24, .block_size = 4, .prefix_caching = false,
                                                    .n_state_slots = 3},
                                    default_block_hash, 10},
                      // And with prefix caching: snapshots in the spare slots, evicted by sequences.
                      stress_config{"state_snapshots", {.n_blocks = 24, .block_size = 4, .prefix_caching = true,
                                                        .n_state_slots = 5},
                                    default_block_hash, 11},
                      stress_config{"state_snapshots_colliding", {.n_blocks = 24, .block_size = 2, .prefix_caching = true,
                                                                  .n_state_slots = 4},
                                    weak_hash, 12}),
    [](const ::testing::TestParamInfo<stress_config>& p) { return p.param.name; });

}  // namespace
}  // namespace anvil::kv
