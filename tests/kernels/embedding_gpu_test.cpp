// Embedding gather (launch_embedding) against embedding_ref for every table type: repeated ids,
// the first and last rows, batches of 1..64 tokens; an id outside the vocabulary gives zeros.
// Outputs poisoned and guarded. Label: gpu.
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/embedding.h"
#include "tests/kernels/matmul_gpu_cases.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;

class EmbeddingGpu : public ::testing::TestWithParam<ggml_type> {};

TEST_P(EmbeddingGpu, MatchesCpuReference) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  const ggml_type t = GetParam();
  std::mt19937 rng(static_cast<unsigned>(t) * 7 + 3);
  const std::int64_t n_vocab = 301, n_embd = anvil::model::info(t).block_elems == 256 ? 1280 : 896;
  const host_weight table(t, n_vocab, n_embd, rng);
  device_bytes dt(table.bytes.size());
  dt.upload(table.bytes.data(), table.bytes.size());

  for (std::int64_t n_tokens : {1, 5, 64}) {
    SCOPED_TRACE("n_tokens=" + std::to_string(n_tokens));
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n_tokens));
    std::uniform_int_distribution<std::int32_t> pick(0, std::int32_t(n_vocab - 1));
    for (auto& id : ids) id = pick(rng);
    ids.front() = std::int32_t(n_vocab - 1);
    if (n_tokens > 2) ids[1] = 0, ids[2] = ids[1];
    std::vector<float> ref(std::size_t(n_tokens * n_embd));
    const float scale = n_tokens == 5 ? std::sqrt(float(n_embd)) : 1.f;  // Gemma's scaled embedding
    embedding_ref({.table = table.bytes.data(),
                   .type = t,
                   .n_embd = n_embd,
                   .n_vocab = n_vocab,
                   .ids = ids.data(),
                   .n_tokens = n_tokens,
                   .out = ref.data(),
                   .scale = scale});

    device_bytes did(ids.size() * sizeof(std::int32_t));
    did.upload(ids.data(), ids.size() * sizeof(std::int32_t));
    guarded_buffer dout(ref.size());
    dout.poison();
    ANVIL_GPU_CHECK(launch_embedding({.table = dt.data(),
                                      .type = t,
                                      .n_embd = n_embd,
                                      .n_vocab = n_vocab,
                                      .ids = did.as<std::int32_t>(),
                                      .n_tokens = n_tokens,
                                      .out = dout.data(),
                                      .scale = scale},
                                     nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const std::vector<float> out = dout.download();
    double worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const double e = std::fabs(double(out[i]) - double(ref[i])) / (std::fabs(double(ref[i])) + 1e-3);
      worst = std::isnan(e) ? e : std::max(worst, e);
    }
    std::printf("  embedding(%s, n_embd=%lld, n_tokens=%lld) max rel error %.3g\n", type_name(t).c_str(),
                static_cast<long long>(n_embd), static_cast<long long>(n_tokens), worst);
    EXPECT_LT(worst, 1e-6);
    EXPECT_TRUE(dout.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(Types, EmbeddingGpu, ::testing::ValuesIn(gpu_weight_types()),
                         [](const ::testing::TestParamInfo<ggml_type>& i) { return type_name(i.param); });

// A tensor-parallel rank's slice: rows [3, 7) of an 8-token table given as its own table with
// vocab_begin 3; ids outside the slice give zeros, those inside the rows the whole table gives.
TEST(EmbeddingGpuLaunch, AVocabularySliceGivesItsRowsAndZerosElsewhere) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  std::mt19937 rng(11);
  const host_weight table(ggml_type::Q8_0, 8, 64, rng);
  const std::size_t row = table.bytes.size() / 8;
  device_bytes dt(4 * row);
  dt.upload(table.bytes.data() + 3 * row, 4 * row);
  const std::vector<std::int32_t> ids = {0, 3, 6, 7, 4, 2};
  device_bytes did(ids.size() * sizeof(std::int32_t));
  did.upload(ids.data(), ids.size() * sizeof(std::int32_t));
  guarded_buffer dout(ids.size() * 64);
  dout.poison();
  ANVIL_GPU_CHECK(launch_embedding({.table = dt.data(),
                                    .type = ggml_type::Q8_0,
                                    .n_embd = 64,
                                    .n_vocab = 4,
                                    .ids = did.as<std::int32_t>(),
                                    .n_tokens = std::int64_t(ids.size()),
                                    .out = dout.data(),
                                    .vocab_begin = 3},
                                   nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  const std::vector<float> out = dout.download();
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const bool mine = ids[t] >= 3 && ids[t] < 7;
    for (std::size_t i = 0; i < 64; ++i) {
      EXPECT_EQ(out[t * 64 + i], mine ? table.values[std::size_t(ids[t]) * 64 + i] : 0.f) << "id " << ids[t] << ", element " << i;
    }
  }
  EXPECT_TRUE(dout.guards_intact());
}

TEST(EmbeddingGpuLaunch, OutOfVocabularyIdGivesZerosAndBadShapesAreRejected) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  std::mt19937 rng(5);
  const host_weight table(ggml_type::Q8_0, 4, 64, rng);
  device_bytes dt(table.bytes.size());
  dt.upload(table.bytes.data(), table.bytes.size());
  const std::vector<std::int32_t> ids = {2, -1, 4, 1};
  device_bytes did(ids.size() * sizeof(std::int32_t));
  did.upload(ids.data(), ids.size() * sizeof(std::int32_t));
  guarded_buffer dout(4 * 64);
  dout.poison();
  const embedding_params p{.table = dt.data(),
                           .type = ggml_type::Q8_0,
                           .n_embd = 64,
                           .n_vocab = 4,
                           .ids = did.as<std::int32_t>(),
                           .n_tokens = 4,
                           .out = dout.data()};
  ANVIL_GPU_CHECK(launch_embedding(p, nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  const std::vector<float> out = dout.download();
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(out[64 + i], 0.f) << "id -1, element " << i;
    EXPECT_EQ(out[128 + i], 0.f) << "id 4 (n_vocab 4), element " << i;
    EXPECT_EQ(out[i], table.values[2 * 64 + i]);
    EXPECT_EQ(out[192 + i], table.values[64 + i]);
  }
  EXPECT_TRUE(dout.guards_intact());

  embedding_params bad = p;
  bad.n_embd = 48;  // not a multiple of the 32-element Q8_0 block
  EXPECT_EQ(launch_embedding(bad, nullptr), hipErrorInvalidValue);
  bad = p;
  bad.out = dout.data() + 1;  // misaligned
  EXPECT_EQ(launch_embedding(bad, nullptr), hipErrorInvalidValue);
  bad = p;
  bad.type = ggml_type::IQ2_XXS;  // no GPU decoder
  EXPECT_EQ(launch_embedding(bad, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
}

}  // namespace
