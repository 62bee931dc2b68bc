// Tensor parallelism: one model split over N ranks, Megatron-style, each rank running its part of
// every layer and joining the others through two collectives (`collectives`). The split:
//   - attention: each rank holds n_head / N query heads and their KV heads (n_head_kv / N, or, when
//     N exceeds the KV heads, the one KV head its query heads read, copied on the ranks that share
//     it); q/k/v by rows, the output projection by columns; the output is summed over the ranks.
//   - feed-forward: gate and up by rows, down by columns (each rank a slice of the width, every
//     expert's and the shared expert's alike); the output is summed over the ranks. The router is
//     whole on every rank, so every rank routes alike.
//   - gated DeltaNet layers: each rank holds ssm_k_heads / N key heads and ssm_v_heads / N value
//     heads, their rows of the q/k/v projection, gate, beta and alpha, their convolution channels,
//     and the output projection by columns; each keeps its heads' recurrent state.
//   - embedding and head by vocabulary: each rank looks up the tokens of its slice (the others'
//     rows are zero, and the sum over the ranks is the embedding) and computes its slice's logits.
//   - biases added after a sum (the output projections', the experts' down) are held by rank 0 only.
// Everything between the sums (norms, residual, RoPE tables) is whole on every rank, and the sums
// leave the same bytes on every rank, so every rank's residual stream is the same.
// A rank's part is an `llm` whose hparams count its own heads and widths (n_vocab stays the
// model's): the forward pass and the KV cache run on it unchanged. Row slices point into the
// mapped file; column slices are copies the shard owns.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/arch/llm.h"

namespace anvil::model {

// What a rank's forward pass calls to join the other ranks' (host memory). Every rank calls the
// same collectives in the same order with the same lengths; a rank that fails makes the others'
// calls throw instead of waiting for it.
class collectives {
 public:
  virtual ~collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x = the sum of every rank's x, added in rank order: the same floats on every rank.
  virtual void all_reduce_sum(std::span<float> x) = 0;
  // `all` = every rank's `mine` (the same length on each), rank after rank.
  virtual void all_gather(std::span<const float> mine, std::span<float> all) = 0;
};

// A rank's slice of the vocabulary: tokens [begin, end); in the logits' gather each rank's slice
// takes `stride` = ceil(n_vocab / N) places.
struct vocab_slice {
  std::int64_t begin = 0, end = 0, stride = 0;
};
vocab_slice vocab_slice_of(std::int64_t n_vocab, int rank, int size);

// Why `m` cannot be split over `n` ranks ("the 8 KV heads do not divide over 3 ranks"), or "" when
// it can.
std::string tp_refusal(const llm& m, int n);

// Rank `rank` of `n`'s part of `m`, which must outlive it.
class llm_shard {
 public:
  // Throws std::invalid_argument with tp_refusal's reason, or for a rank outside [0, n).
  llm_shard(const llm& m, int rank, int n);
  llm_shard(llm_shard&&) = default;
  llm_shard& operator=(llm_shard&&) = default;
  llm_shard(const llm_shard&) = delete;
  llm_shard& operator=(const llm_shard&) = delete;

  const llm& model() const { return m_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  vocab_slice vocab() const { return vocab_; }
  // Bytes of this rank's weights: the slices it reads (whole tensors it keeps counted whole).
  std::size_t weight_bytes() const { return weight_bytes_; }

 private:
  llm m_;
  int rank_ = 0, size_ = 1;
  vocab_slice vocab_;
  std::size_t weight_bytes_ = 0;
  std::vector<std::vector<std::byte>> owned_;  // column slices (each buffer stays put when moved)
};

}  // namespace anvil::model
