// A micro-benchmark for gpu_roofline --phase-chain: is a one-token decode step's chain of small
// GEMVs cheaper as one launch per projection (each waiting on the one before, programmatic
// dependent launch, in a graph) or as one persistent kernel whose blocks meet at a grid-wide
// barrier between projections? The shapes are qwen2.5-0.5b's (q/k/v 896 -> 1152, o 896 -> 896,
// gate/up 896 -> 9728, down 4864 -> 896) with int8 weights, so a layer's bytes are close to its
// Q8_0 ones; every phase reads the one before's output, as the model's projections do.
// Measured on an H100 (bench/GPU_NOTES.md, session 44): the barrier costs about twice what a
// dependent launch costs, so the launches stay. Two more chains bound the launches' own cost: the
// same launches with every row's weights requested before the wait, and launches with no work.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/gpu_runtime.h"

namespace anvil::bench {

inline constexpr int phase_chain_phases = 4;          // a layer's projections
inline constexpr int phase_chain_max_width = 9728;    // the widest output (gate and up)

enum class phase_mode {
  launches,             // a launch per projection, each launched dependent on the one before
  persistent,           // one launch; a grid-wide barrier between projections
  persistent_unsynced,  // as persistent without the barrier: the projections' work alone (the
                        // outputs are not the model's: a phase may read its input while written)
  launches_prefetched,  // as launches, each warp's rows' weights (up to 12 16-byte loads a lane)
                        // requested before the wait instead of its first row's only
  launches_empty,       // as launches with no work: the chain of dependent launches alone
};

struct phase_chain_params {
  const std::int8_t* w = nullptr;  // `layers` layers back to back, phase_chain_layer_bytes() each
  float* buf = nullptr;            // 2 x phase_chain_max_width floats: the phases' inputs and outputs
  unsigned* sync = nullptr;        // 2 words, zero before the first launch (persistent modes keep them so)
  int layers = 0;
  int blocks = 0;                  // the grid: every mode's launches use this many blocks of 256 threads
};

// Bytes of one layer's four matrices (each rounded up to 256).
std::size_t phase_chain_layer_bytes();

// Queues one token's layers on `stream` (capturable). Preconditions: p.blocks >= 1, and for the
// persistent modes at most 2 per multiprocessor, so that every block is resident at once (a block
// is 256 threads with 19.5 KB of shared memory: any device the kernels build for holds two).
hipError_t launch_phase_chain(const phase_chain_params& p, phase_mode mode, hipStream_t stream);

}  // namespace anvil::bench
