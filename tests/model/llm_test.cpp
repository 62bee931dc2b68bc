// Loading architectures from GGUF and the CPU forward pass: shapes, clear load errors, and the
// invariants a paged, batched forward pass must keep (chunking, batching and block placement
// never change a sequence's logits).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/arch/cpu_forward.h"
#include "tests/model/fixtures.h"
#include "tests/scratch_dir.h"

namespace {

using namespace anvil::model;
using anvil::model::testing::synth_fixture;
namespace kernels = anvil::kernels;

std::string load_error(gguf_writer& w) {
  // One file per process: the loader maps it, and another process rewriting the same path (two
  // builds' tests at once) would pull the pages from under it (SIGBUS).
  const std::string path = anvil::testing::scratch_path("bad.gguf");
  w.write(path);
  try {
    load_llm(gguf_file::open(path));
  } catch (const model_error& e) {
    return e.what();
  }
  return "";
}

void put_llama_hparams(gguf_writer& w, const std::string& arch) {
  w.set_string("general.architecture", arch);
  w.set_u32(arch + ".context_length", 128);
  w.set_u32(arch + ".embedding_length", 32);
  w.set_u32(arch + ".block_count", 1);
  w.set_u32(arch + ".feed_forward_length", 64);
  w.set_u32(arch + ".attention.head_count", 4);
}

TEST(LoadLlm, ReadsTheHyperParametersOfEachShape) {
  for (const char* name :
       {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny-qwen2moe", "tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss", "tiny-gemma3",
        "tiny-mistral3"}) {
    const synth_shape& s = *find_synth_shape(name);
    const llm m = load_llm(gguf_file::open(synth_fixture(name, synth_mix::f32)));
    EXPECT_EQ(m.hp.arch_name, std::string(arch_name(s.architecture))) << name;
    EXPECT_EQ(m.hp.n_vocab, s.n_vocab);
    EXPECT_EQ(m.hp.n_embd, s.n_embd);
    EXPECT_EQ(m.hp.n_layer, s.n_layer);
    EXPECT_EQ(m.hp.n_head, s.n_head);
    EXPECT_EQ(m.hp.n_head_kv, s.n_head_kv);
    EXPECT_EQ(m.hp.head_dim, s.head_dim);
    EXPECT_EQ(m.hp.n_ff, s.n_ff);
    EXPECT_EQ(m.hp.tied_output, s.tied_output);
    EXPECT_FLOAT_EQ(m.hp.rope_base, s.rope_base);
    const bool gpt_oss = s.architecture == arch::gpt_oss;
    EXPECT_EQ(m.hp.qkv_bias, s.architecture == arch::qwen2 || s.architecture == arch::qwen2moe || gpt_oss);
    EXPECT_EQ(m.hp.o_bias, gpt_oss);
    EXPECT_EQ(m.hp.attn_sinks, gpt_oss);
    EXPECT_EQ(m.hp.sliding_window, s.sliding_window);
    EXPECT_EQ(m.layers[0].sinks.size(), std::size_t(gpt_oss ? s.n_head : 0));
    EXPECT_EQ(m.layers[0].bo.size(), std::size_t(gpt_oss ? s.n_embd : 0));
    EXPECT_EQ(m.hp.qk_norm, s.architecture == arch::qwen3 || s.architecture == arch::qwen3moe || s.architecture == arch::gemma3);
    const bool interleaved = s.architecture == arch::llama || s.architecture == arch::mistral3;
    EXPECT_EQ(m.hp.rope, interleaved ? anvil::kernels::rope_style::normal : anvil::kernels::rope_style::neox);
    ASSERT_EQ(m.layers.size(), std::size_t(s.n_layer));
    EXPECT_EQ(m.layers[0].wq.out, s.n_head * s.head_dim);
    EXPECT_EQ(m.hp.n_expert, s.n_expert) << name;
    EXPECT_EQ(m.hp.n_expert_used, s.n_expert_used) << name;
    EXPECT_EQ(m.has_experts(), s.n_expert > 0) << name;
    for (const layer_weights& l : m.layers) {
      EXPECT_EQ(l.moe(), s.n_expert > 0) << name;
      if (!l.moe()) continue;
      EXPECT_EQ(m.hp.n_ff_exp, s.n_ff_exp) << name;
      EXPECT_EQ(l.router.out, s.n_expert);
      EXPECT_EQ(l.gate_exps.count, s.n_expert);
      EXPECT_EQ(l.down_exps.in, s.n_ff_exp);
      EXPECT_EQ(m.hp.n_ff_shexp, s.n_ff_shexp) << name;
      EXPECT_EQ(l.gate_shexp.data != nullptr, s.n_ff_shexp > 0) << name;
      EXPECT_EQ(l.shexp_gate.size(), std::size_t(s.n_ff_shexp > 0 ? s.n_embd : 0)) << name;
      EXPECT_EQ(m.hp.expert_weights_norm, s.architecture != arch::qwen2moe) << name;
      EXPECT_EQ(l.router_b.size(), std::size_t(gpt_oss ? s.n_expert : 0)) << name;
      EXPECT_EQ(l.gate_exps_b.size(), std::size_t(gpt_oss ? s.n_expert * s.n_ff_exp : 0)) << name;
      EXPECT_EQ(l.down_exps_b.size(), std::size_t(gpt_oss ? s.n_expert * s.n_embd : 0)) << name;
      // Expert e's matrix is the e-th slice of the stacked tensor.
      EXPECT_EQ(l.up_exps.at(3).data, l.up_exps.data + 3 * l.up_exps.stride);
      EXPECT_EQ(l.up_exps.stride * std::size_t(s.n_expert), *row_bytes(l.up_exps.type, s.n_embd) * std::size_t(s.n_ff_exp * s.n_expert));
    }
    // What a token reads: every tensor, but of each layer's experts only the ones it is routed to.
    std::size_t skipped = 0;
    for (const layer_weights& l : m.layers) {
      for (const stacked_weight* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
        skipped += w->stride * std::size_t(w->count - m.hp.n_expert_used);
      }
      if (gpt_oss) skipped += std::size_t((2 * s.n_ff_exp + s.n_embd) * (s.n_expert - s.n_expert_used)) * sizeof(float);
    }
    EXPECT_EQ(m.token_weight_bytes(), m.weight_bytes() - skipped) << name;
    EXPECT_EQ(skipped > 0, s.n_expert > s.n_expert_used) << name;
  }
}

TEST(LoadLlm, GptOssLayersAlternateWindowsAndTakeYarn) {
  const synth_shape& s = *find_synth_shape("tiny-gpt-oss");
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-gpt-oss", synth_mix::f32)));
  EXPECT_EQ(m.hp.arch_name, "gpt-oss");
  // Sliding window on the even layers, full attention on the odd ones (HF's layer_types).
  EXPECT_EQ(m.hp.layer_window(0), s.sliding_window);
  EXPECT_EQ(m.hp.layer_window(1), 0);
  EXPECT_FLOAT_EQ(m.hp.swiglu_limit, 7.f);
  EXPECT_FLOAT_EQ(m.hp.swiglu_alpha, 1.702f);
  // YaRN: factor 32 over 128 positions, base 150000, 32 pairs. HF's ramp without rounding runs from
  // pair low = 64 ln(128 / (32 * 2 pi)) / (2 ln 150000) < 0 (so 0) to high = 64 ln(128 / (2 pi)) /
  // (2 ln 150000) = 8.09: pairs from 9 on are interpolated (factor 32), pair 0 extrapolated (1).
  ASSERT_EQ(m.rope_freqs.size(), std::size_t(s.head_dim / 2));
  const double high = 64 * std::log(128 / (2 * M_PI)) / (2 * std::log(150000.0));
  EXPECT_FLOAT_EQ(m.rope_freqs[0], 1.f);
  EXPECT_NEAR(m.rope_freqs[4], 1 / (4 / high / 32 + (1 - 4 / high)), 1e-5);
  EXPECT_FLOAT_EQ(m.rope_freqs[9], 32.f);
  EXPECT_FLOAT_EQ(m.rope_freqs[31], 32.f);
  const float mscale = 0.1f * std::log(32.f) + 1;
  EXPECT_NEAR(m.hp.attention_scale(), mscale * mscale / 8, 1e-6);
}

TEST(LoadLlm, Mistral3TakesYarnWithoutItsMagnitudeAndTheQueriesTemperature) {
  const synth_shape& s = *find_synth_shape("tiny-mistral3");
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-mistral3", synth_mix::f32)));
  EXPECT_EQ(m.hp.architecture, arch::mistral3);
  EXPECT_EQ(m.hp.rope, anvil::kernels::rope_style::normal);
  EXPECT_FLOAT_EQ(m.hp.yarn_factor, s.yarn_factor);
  ASSERT_EQ(m.rope_freqs.size(), std::size_t(s.head_dim / 2));
  // yarn_log_multiplier 1 (HF's mscale_all_dim = mscale = 1): no magnitude factor.
  EXPECT_FLOAT_EQ(m.hp.yarn_attn_factor, 1.f);
  EXPECT_FLOAT_EQ(m.hp.attention_scale(), 1.f / 8);
  EXPECT_FLOAT_EQ(m.hp.attn_temp_scale, 0.1f);
  EXPECT_EQ(m.hp.attn_temp_floor, s.yarn_orig_ctx);
  EXPECT_FLOAT_EQ(anvil::kernels::attn_temperature(31, 0.1f, 32), 1.f);
  EXPECT_FLOAT_EQ(anvil::kernels::attn_temperature(32, 0.1f, 32), float(1 + 0.1 * std::log(2.0)));
  EXPECT_FLOAT_EQ(anvil::kernels::attn_temperature(100, 0.1f, 32), float(1 + 0.1 * std::log(4.0)));
}

TEST(LoadLlm, Gemma4LayersTakeTheirOwnHeadsAndTheGlobalLayersVIsTheirK) {
  const synth_shape& s = *find_synth_shape("tiny-gemma4");
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-gemma4", synth_mix::f32)));
  const hparams& hp = m.hp;
  EXPECT_EQ(hp.architecture, arch::gemma4);
  for (std::int64_t l = 0; l < 6; ++l) {
    const bool global = l == 5;
    EXPECT_EQ(hp.layer_window(l), global ? 0 : s.sliding_window) << l;
    EXPECT_EQ(hp.layer_head_dim(l), global ? s.head_dim : s.head_dim_swa) << l;
    EXPECT_EQ(hp.layer_kv_heads(l), global ? s.n_head_kv_global : s.n_head_kv) << l;
    EXPECT_EQ(hp.layer_rope_dim(l), hp.layer_head_dim(l)) << l;
    EXPECT_EQ(hp.own_rope(l), !global) << l;
    EXPECT_EQ(m.layers[std::size_t(l)].wv.data == nullptr, global) << l << ": the global layers' V is their K";
    EXPECT_EQ(m.layers[std::size_t(l)].wq.out, s.n_head * hp.layer_head_dim(l)) << l;
    EXPECT_EQ(m.layers[std::size_t(l)].k_norm.size(), std::size_t(hp.layer_head_dim(l))) << l;
    EXPECT_NE(m.layers[std::size_t(l)].out_scale, 1.f) << l;
  }
  EXPECT_TRUE(hp.v_norm);
  EXPECT_FLOAT_EQ(hp.final_softcap, 30.f);
  EXPECT_FLOAT_EQ(hp.attention_scale(), 1.f);
  EXPECT_FLOAT_EQ(hp.rope_base_swa, 10000.f);
  // The global layers' proportional RoPE: a quarter of the pairs turn.
  ASSERT_EQ(m.rope_freqs.size(), std::size_t(s.head_dim / 2));
  EXPECT_EQ(m.rope_freqs[s.head_dim / 8 - 1], 1.f);
  EXPECT_EQ(m.rope_freqs[s.head_dim / 8], 1e30f);
  // A block holds every layer's K and V at its own shape.
  const std::size_t sliding_row = std::size_t(s.n_head_kv * s.head_dim_swa), global_row = std::size_t(s.n_head_kv_global * s.head_dim);
  EXPECT_EQ(kv_cache_storage::bytes_per_block(hp, 16), 2 * 16 * (5 * sliding_row + global_row) * sizeof(float));
  kv_cache_storage cache(hp, 3, 16);
  EXPECT_EQ(cache.bytes(), 3 * kv_cache_storage::bytes_per_block(hp, 16));
  EXPECT_EQ(cache.layer(5).head_dim, s.head_dim);
  EXPECT_EQ(cache.layer(5).n_kv_heads, s.n_head_kv_global);
  EXPECT_EQ(cache.layer(4).head_dim, s.head_dim_swa);
  EXPECT_EQ(cache.layer(5).k, cache.layer(4).k + 3 * 16 * sliding_row) << "layer 5's rows follow layer 4's";
}

// Gemma 4 26B-A4B's make: a dense feed-forward beside the experts in every layer, gate and up of
// each expert read as the two halves of one stacked tensor.
TEST(LoadLlm, Gemma4ExpertsSitBesideADenseFeedForward) {
  const synth_shape& s = *find_synth_shape("tiny-gemma4moe");
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-gemma4moe", synth_mix::q8_0)));
  ASSERT_EQ(m.hp.n_expert, s.n_expert);
  for (const layer_weights& l : m.layers) {
    ASSERT_TRUE(l.moe());
    EXPECT_EQ(l.gate.out, s.n_ff);
    EXPECT_EQ(l.router_scale.size(), std::size_t(s.n_embd));
    EXPECT_EQ(l.expert_scale.size(), std::size_t(s.n_expert));
    EXPECT_EQ(l.post_ffn_norm_2.size(), std::size_t(s.n_embd));
    const std::size_t row = *row_bytes(l.gate_exps.type, s.n_embd);
    EXPECT_EQ(l.up_exps.data, l.gate_exps.data + std::size_t(s.n_ff_exp) * row) << "up follows gate within an expert";
    EXPECT_EQ(l.gate_exps.stride, 2 * std::size_t(s.n_ff_exp) * row);
    EXPECT_EQ(l.gate_exps.at(1).data, l.gate_exps.data + l.gate_exps.stride);
  }
  // What a token reads: every tensor but the experts it is not routed to, gate and up counted once.
  std::size_t skipped = 0;
  for (const layer_weights& l : m.layers) {
    for (const stacked_weight* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
      skipped += *row_bytes(w->type, w->in) * std::size_t(w->out) * std::size_t(s.n_expert - s.n_expert_used);
    }
  }
  EXPECT_EQ(m.token_weight_bytes(), m.weight_bytes() - skipped);
}

TEST(LoadLlm, Gemma3LayersSlideFiveInSixWithTheirOwnRope) {
  const synth_shape& s = *find_synth_shape("tiny-gemma3");
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-gemma3", synth_mix::f32)));
  const hparams& hp = m.hp;
  EXPECT_EQ(hp.arch_name, "gemma3");
  // HF's layer_types: every sixth layer global, the rest sliding.
  for (std::int64_t l = 0; l < 6; ++l) EXPECT_EQ(hp.layer_window(l), l == 5 ? 0 : s.sliding_window) << l;
  // The global layers take the file's base and linear scaling; the sliding ones base 10000, unscaled.
  EXPECT_FLOAT_EQ(hp.layer_rope(5).base, s.rope_base);
  EXPECT_FLOAT_EQ(hp.layer_rope(5).freq_scale, 1.f / s.rope_linear_factor);
  EXPECT_FLOAT_EQ(hp.layer_rope(0).base, 10000.f);
  EXPECT_FLOAT_EQ(hp.layer_rope(0).freq_scale, 1.f);
  EXPECT_TRUE(hp.split_rope());
  EXPECT_TRUE(hp.qk_norm);
  EXPECT_TRUE(hp.post_norms);
  EXPECT_EQ(hp.ffn_act, kernels::glu_activation::gelu_tanh);
  EXPECT_FLOAT_EQ(hp.embd_scale, 16.f);  // sqrt(256)
  EXPECT_FLOAT_EQ(hp.attention_scale(), 1.f / 16);  // query_pre_attn_scalar = head_dim 256
  for (const layer_weights& l : m.layers) {
    EXPECT_EQ(l.post_attn_norm.size(), std::size_t(s.n_embd));
    EXPECT_EQ(l.post_ffn_norm.size(), std::size_t(s.n_embd));
  }
  EXPECT_TRUE(hp.tied_output);
}

TEST(LoadLlm, Qwen35LayersAreThreeDeltaNetsToOneGatedAttention) {
  const synth_shape& s = *find_synth_shape("tiny-qwen35");
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-qwen35", synth_mix::f32)));
  const hparams& hp = m.hp;
  EXPECT_EQ(hp.architecture, arch::qwen35);
  for (std::int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(hp.recurrent(l), l != 3) << l;
    EXPECT_EQ(m.layers[std::size_t(l)].recurrent(), l != 3) << l;
  }
  EXPECT_TRUE(hp.attn_out_gate);
  EXPECT_TRUE(hp.qk_norm);
  EXPECT_EQ(hp.rope, kernels::rope_style::neox);
  EXPECT_EQ(hp.rope_dim, s.rope_dim);
  EXPECT_EQ(hp.ssm_k_heads, s.ssm_k_heads);
  EXPECT_EQ(hp.ssm_v_heads, s.ssm_v_heads);
  EXPECT_EQ(hp.ssm_head_k, s.ssm_head);
  EXPECT_EQ(hp.ssm_head_v, s.ssm_head);
  EXPECT_EQ(hp.ssm_conv_kernel, s.ssm_conv_kernel);
  EXPECT_EQ(hp.ssm_conv_channels(), 2 * 2 * 32 + 4 * 32);
  const layer_weights& d = m.layers[0];
  EXPECT_EQ(d.ssm_conv.size(), std::size_t(hp.ssm_conv_channels() * hp.ssm_conv_kernel));
  EXPECT_EQ(d.ssm_a.size(), std::size_t(hp.ssm_v_heads));
  EXPECT_EQ(d.ssm_norm.size(), std::size_t(hp.ssm_head_v));
  EXPECT_EQ(d.wq.data, nullptr);
  EXPECT_EQ(m.layers[3].wq.out, 2 * hp.n_head * hp.head_dim) << "each head's query and its gate";
  // Only the attention layer keeps KV; the others a state.
  const kv_layer_map map = map_kv_layers(hp, true);
  EXPECT_EQ(map.main_layers, 1);
  EXPECT_EQ(map.state_layers, 3);
  EXPECT_TRUE(map.stateful(0));
  EXPECT_EQ(map.index[3], 0);
  EXPECT_EQ(kv_cache_storage::bytes_per_state_slot(hp),
            std::size_t(3 * (3 * hp.ssm_conv_channels() + 4 * 32 * 32)) * sizeof(float));
}

TEST(LoadLlm, ChecksTheDeltaNetMetadata) {
  const auto with = [](const std::function<void(gguf_writer&)>& edit) {
    gguf_writer w;
    put_llama_hparams(w, "qwen35");
    for (const auto& [k, v] : {std::pair{"ssm.conv_kernel", 4}, {"ssm.state_size", 16}, {"ssm.group_count", 2},
                               {"ssm.time_step_rank", 4}, {"ssm.inner_size", 64}}) {
      w.set_u32(std::string("qwen35.") + k, std::uint32_t(v));
    }
    edit(w);
    return load_error(w);
  };
  EXPECT_NE(with([](gguf_writer& w) { w.set_u32("qwen35.ssm.time_step_rank", 3); }).find("multiple of ssm.group_count"),
            std::string::npos);
  EXPECT_NE(with([](gguf_writer& w) { w.set_u32("qwen35.ssm.conv_kernel", 1); }).find("ssm.conv_kernel 1"),
            std::string::npos);
  EXPECT_NE(with([](gguf_writer& w) { w.set_u32("qwen35.full_attention_interval", 1); }).find("full_attention_interval 1"),
            std::string::npos);
  EXPECT_NE(with([](gguf_writer& w) { w.set_bool("qwen35.attention.recurrent_layers", true); }).find("recurrent_layers"),
            std::string::npos);
  EXPECT_NE(with([](gguf_writer& w) { w.set_u32("qwen35.nextn_predict_layers", 99); }).find("nextn_predict_layers"),
            std::string::npos);
  // Past the metadata, the first recurrent layer's tensors are what is missing.
  EXPECT_NE(with([](gguf_writer&) {}).find("missing tensor"), std::string::npos) << with([](gguf_writer&) {});
}

TEST(LoadLlm, RefusesWhatGemma3DoesNotHave) {
  gguf_writer soft;
  put_llama_hparams(soft, "gemma3");
  soft.set_u32("gemma3.attention.sliding_window", 512);
  soft.set_f32("gemma3.final_logit_softcapping", 30.f);
  EXPECT_NE(load_error(soft).find("soft-capping"), std::string::npos) << load_error(soft);
  gguf_writer moe;
  put_llama_hparams(moe, "gemma3");
  moe.set_u32("gemma3.attention.sliding_window", 512);
  moe.set_u32("gemma3.expert_count", 8);
  EXPECT_NE(load_error(moe).find("gemma3 with experts"), std::string::npos) << load_error(moe);
  gguf_writer no_window;
  put_llama_hparams(no_window, "gemma3");
  EXPECT_NE(load_error(no_window).find("gemma3.attention.sliding_window"), std::string::npos) << load_error(no_window);
}

// Gemma 4 E2B / E4B's hyper-parameters out of range are refused by name: shared-KV layers with no
// earlier layer of their kind, a width per layer for another architecture or of the wrong length;
// and a layer pattern must cover every block.
TEST(LoadLlm, RefusesGemma4HyperParametersOutOfRange) {
  const auto gemma4 = [](gguf_writer& w, std::uint32_t blocks, const std::vector<bool>& pattern) {
    put_llama_hparams(w, "gemma4");
    w.set_u32("gemma4.block_count", blocks);
    w.set_u32("gemma4.attention.sliding_window", 512);
    w.set_bools("gemma4.attention.sliding_window_pattern", pattern);
    w.set_u32("gemma4.attention.key_length_swa", 8);
  };
  gguf_writer ple;
  gemma4(ple, 1, {false});
  ple.set_u32("gemma4.embedding_length_per_layer_input", 70000);
  EXPECT_NE(load_error(ple).find("embedding_length_per_layer_input' out of range"), std::string::npos) << load_error(ple);
  gguf_writer all_shared;
  gemma4(all_shared, 1, {false});
  all_shared.set_u32("gemma4.attention.shared_kv_layers", 20);
  EXPECT_NE(load_error(all_shared).find("shared_kv_layers' is 20 of 1 blocks"), std::string::npos) << load_error(all_shared);
  gguf_writer no_source;  // a sliding layer, then the shared global one: no global layer before it
  gemma4(no_source, 2, {true, false});
  no_source.set_u32("gemma4.attention.shared_kv_layers", 1);
  EXPECT_NE(load_error(no_source).find("layer 1 shares the KV of the last earlier global layer"), std::string::npos)
      << load_error(no_source);
  gguf_writer widths;  // put_llama_hparams with a width per layer
  gemma4(widths, 2, {true, false});
  widths.set_i32s("gemma4.feed_forward_length", {64});
  EXPECT_NE(load_error(widths).find("one width per block"), std::string::npos) << load_error(widths);
  gguf_writer llama_widths;
  put_llama_hparams(llama_widths, "llama");
  llama_widths.set_i32s("llama.feed_forward_length", {64});
  EXPECT_NE(load_error(llama_widths).find("per layer is Gemma 4's, not llama's"), std::string::npos)
      << load_error(llama_widths);
  gguf_writer pattern;
  put_llama_hparams(pattern, "gemma4");
  pattern.set_u32("gemma4.attention.sliding_window", 512);
  pattern.set_bools("gemma4.attention.sliding_window_pattern", {true, false});
  EXPECT_NE(load_error(pattern).find("one bool per block"), std::string::npos) << load_error(pattern);
}

// Gemma 4 E2B / E4B's make: per-layer token embeddings, and the last two layers (a sliding one and
// the last global one) on the KV of layers 4 and 5, with feed-forwards twice as wide; their KV takes
// no place in a block.
TEST(LoadLlm, Gemma4SharedLayersReadAnEarlierLayersKvAndEveryLayerItsPerLayerInput) {
  const synth_shape& s = *find_synth_shape("tiny-gemma4e");
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-gemma4e", synth_mix::q8_0)));
  const hparams& hp = m.hp;
  ASSERT_EQ(hp.n_layer, 8);
  EXPECT_EQ(hp.ple_dim, s.ple_dim);
  EXPECT_EQ(hp.n_kv_shared, 2);
  EXPECT_EQ(hp.n_ff, 2 * s.n_ff);
  const std::int64_t sources[] = {0, 1, 2, 3, 4, 5, 4, 5};
  for (std::int64_t l = 0; l < 8; ++l) {
    const layer_weights& w = m.layers[std::size_t(l)];
    EXPECT_EQ(hp.kv_source(l), sources[l]) << l;
    EXPECT_EQ(hp.layer_window(l) > 0, l != 5 && l != 7) << l;
    EXPECT_EQ(w.wk.data == nullptr, l >= 6) << l;
    EXPECT_EQ(w.k_norm.empty(), l >= 6) << l;
    EXPECT_EQ(w.q_norm.size(), std::size_t(hp.layer_head_dim(l))) << l;
    EXPECT_EQ(w.gate.out, l >= 6 ? 2 * s.n_ff : s.n_ff) << l;
    EXPECT_EQ(w.ple_gate.in, s.n_embd);
    EXPECT_EQ(w.ple_gate.out, s.ple_dim);
    EXPECT_EQ(w.ple_proj.out, s.n_embd);
    EXPECT_EQ(w.ple_post_norm.size(), std::size_t(s.n_embd));
  }
  EXPECT_EQ(m.ple_embd.in, 8 * s.ple_dim);
  EXPECT_EQ(m.ple_embd.out, s.n_vocab);
  EXPECT_EQ(m.ple_model_proj.out, 8 * s.ple_dim);
  EXPECT_EQ(m.ple_proj_norm.size(), std::size_t(s.ple_dim));
  // Of the per-layer embeddings a token reads its own row.
  const std::size_t ple_row = *row_bytes(m.ple_embd.type, m.ple_embd.in);
  EXPECT_EQ(m.token_weight_bytes(), m.weight_bytes() - ple_row * std::size_t(s.n_vocab - 1));
  // The KV map: layers 6 and 7 are layers 4 and 5 there, in either pool layout.
  for (const bool window_pool : {false, true}) {
    const kv_layer_map map = map_kv_layers(hp, window_pool);
    EXPECT_EQ(map.index[6], map.index[4]);
    EXPECT_EQ(map.index[7], map.index[5]);
    EXPECT_EQ(map.home[6], map.home[4]);
    EXPECT_EQ(map.main_layers + map.window_layers, 6);
    const kv_layer_map counts = count_kv_layers(hp, window_pool);
    EXPECT_EQ(counts.main_layers, map.main_layers);
    EXPECT_EQ(counts.window_layers, map.window_layers);
  }
  const std::size_t sliding_row = std::size_t(s.n_head_kv * s.head_dim_swa), global_row = std::size_t(s.n_head_kv_global * s.head_dim);
  EXPECT_EQ(kv_cache_storage::bytes_per_block(hp, 16), 2 * 16 * (5 * sliding_row + global_row) * sizeof(float));
  kv_cache_storage cache(hp, 3, 16);
  EXPECT_EQ(cache.bytes(), 3 * kv_cache_storage::bytes_per_block(hp, 16));
  EXPECT_EQ(cache.layer(6).k, cache.layer(4).k);
  EXPECT_EQ(cache.layer(7).v, cache.layer(5).v);
}

void put_expert_counts(gguf_writer& w, const std::string& arch, std::uint32_t count, std::uint32_t used) {
  w.set_u32(arch + ".expert_count", count);
  w.set_u32(arch + ".expert_used_count", used);
}

TEST(LoadLlm, ChecksTheExpertMetadata) {
  gguf_writer used;
  put_llama_hparams(used, "llama");
  put_expert_counts(used, "llama", 4, 5);
  EXPECT_NE(load_error(used).find("expert_used_count 5 of expert_count 4"), std::string::npos) << load_error(used);
  gguf_writer alone;
  put_llama_hparams(alone, "llama");
  alone.set_u32("llama.expert_used_count", 2);
  EXPECT_NE(load_error(alone).find("'llama.expert_used_count' without 'llama.expert_count'"), std::string::npos);
  gguf_writer none;
  put_llama_hparams(none, "qwen3moe");
  EXPECT_NE(load_error(none).find("missing metadata 'qwen3moe.expert_count'"), std::string::npos) << load_error(none);
  gguf_writer sigmoid;
  put_llama_hparams(sigmoid, "qwen3moe");
  put_expert_counts(sigmoid, "qwen3moe", 4, 2);
  sigmoid.set_u32("qwen3moe.expert_gating_func", 2);
  EXPECT_NE(load_error(sigmoid).find("expert_gating_func 2 is not supported"), std::string::npos) << load_error(sigmoid);
}

// Layer 0 of put_llama_hparams's shape, up to its feed-forward: zero tensors of the right shapes.
void put_layer0_attention(gguf_writer& w) {
  const auto zeros = [&](const std::string& name, std::vector<std::int64_t> dims) {
    std::int64_t n = 1;
    for (std::int64_t d : dims) n *= d;
    w.add_tensor(name, ggml_type::F32, dims, std::vector<std::byte>(std::size_t(n) * 4));
  };
  zeros("token_embd.weight", {32, 10});
  zeros("output_norm.weight", {32});
  zeros("blk.0.attn_norm.weight", {32});
  for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output"}) zeros(std::string("blk.0.") + t + ".weight", {32, 32});
  zeros("blk.0.ffn_norm.weight", {32});
}

TEST(LoadLlm, ChecksTheExpertTensors) {
  gguf_writer old;
  put_llama_hparams(old, "llama");
  put_expert_counts(old, "llama", 4, 2);
  put_layer0_attention(old);
  old.add_tensor("blk.0.ffn_gate.0.weight", ggml_type::F32, {32, 64}, std::vector<std::byte>(32 * 64 * 4));
  EXPECT_NE(load_error(old).find("experts stored one tensor each"), std::string::npos) << load_error(old);

  gguf_writer shape;
  put_llama_hparams(shape, "llama");
  put_expert_counts(shape, "llama", 4, 2);
  put_layer0_attention(shape);
  shape.add_tensor("blk.0.ffn_gate_inp.weight", ggml_type::F32, {32, 4}, std::vector<std::byte>(32 * 4 * 4));
  shape.add_tensor("blk.0.ffn_gate_exps.weight", ggml_type::F32, {32, 64, 3}, std::vector<std::byte>(32 * 64 * 3 * 4));
  EXPECT_NE(load_error(shape).find("tensor 'blk.0.ffn_gate_exps.weight' has shape [32, 64, 3], expected [32, 64, 4]"),
            std::string::npos)
      << load_error(shape);
}

TEST(LoadLlm, RefusesAnUnsupportedArchitecture) {
  gguf_writer w;
  put_llama_hparams(w, "gemma2");
  EXPECT_NE(load_error(w).find("unsupported architecture 'gemma2'"), std::string::npos);
}

TEST(LoadLlm, NamesMissingMetadataAndTensors) {
  gguf_writer none;
  EXPECT_NE(load_error(none).find("general.architecture"), std::string::npos);
  gguf_writer w;
  put_llama_hparams(w, "llama");
  EXPECT_NE(load_error(w).find("missing tensor 'token_embd.weight'"), std::string::npos);
  w.add_tensor("token_embd.weight", ggml_type::F32, {32, 10}, std::vector<std::byte>(32 * 10 * 4));
  w.add_tensor("output_norm.weight", ggml_type::F32, {32}, std::vector<std::byte>(32 * 4));
  w.add_tensor("blk.0.attn_norm.weight", ggml_type::F32, {31}, std::vector<std::byte>(31 * 4));
  EXPECT_NE(load_error(w).find("tensor 'blk.0.attn_norm.weight' has shape [31], expected [32]"), std::string::npos);
}

TEST(LoadLlm, RefusesInconsistentHeads) {
  gguf_writer w;
  put_llama_hparams(w, "llama");
  w.set_u32("llama.attention.head_count_kv", 3);
  EXPECT_NE(load_error(w).find("not a multiple of head_count_kv"), std::string::npos);
  gguf_writer y;
  put_llama_hparams(y, "llama");
  y.set_string("llama.rope.scaling.type", "longrope");
  EXPECT_NE(load_error(y).find("rope scaling 'longrope' is not supported"), std::string::npos) << load_error(y);
  gguf_writer yarn;
  put_llama_hparams(yarn, "llama");
  yarn.set_string("llama.rope.scaling.type", "yarn");
  EXPECT_NE(load_error(yarn).find("rope.scaling.factor must be at least 1 for YaRN"), std::string::npos) << load_error(yarn);
  yarn.set_f32("llama.rope.scaling.factor", 4.f);
  EXPECT_NE(load_error(yarn).find("missing metadata 'llama.rope.scaling.original_context_length'"), std::string::npos)
      << load_error(yarn);
}

// A cache of n_blocks blocks, with two state slots for a model with recurrent layers.
kv_cache_storage cache_of(const llm& m, std::int64_t n_blocks, std::int64_t block_size,
                          kernels::kv_dtype t = kernels::kv_dtype::f16) {
  return kv_cache_storage(m.hp, n_blocks, block_size, t, std::pmr::get_default_resource(), 0,
                          m.hp.has_recurrent() ? 2 : 0);
}

// Runs one sequence through the forward pass in chunks (its state, if any, in slot `slot`);
// returns logits for every position.
std::vector<float> run_all(const llm& m, const std::vector<std::int32_t>& tokens, std::int64_t chunk,
                           const std::vector<std::int32_t>& table, kv_cache_storage& cache, std::int32_t slot = 0) {
  cpu_forward fwd(m);
  std::vector<float> all, logits;
  for (std::size_t pos = 0; pos < tokens.size(); pos += std::size_t(chunk)) {
    const std::size_t n = std::min<std::size_t>(std::size_t(chunk), tokens.size() - pos);
    const forward_seq seq{.tokens = std::span(tokens).subspan(pos, n),
                          .start_pos = std::int64_t(pos),
                          .block_table = table,
                          .all_logits = true,
                          .state_slot = m.hp.has_recurrent() ? slot : -1};
    fwd.run(std::span(&seq, 1), cache, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

std::vector<std::int32_t> some_tokens(std::size_t n, std::int32_t seed) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = std::int32_t((i * 7919 + std::size_t(seed) * 104729) % 259);
  return t;
}

// One test per synth shape (each its own process under ctest: the thirteen shapes' nine mixes
// together passed the 120 s timeout on CI's two cores).
class CpuForwardShape : public ::testing::TestWithParam<const char*> {};

TEST_P(CpuForwardShape, LogitsAreFiniteAndVariedForEveryMix) {
  const char* shape = GetParam();
  for (synth_mix mix : {synth_mix::f32, synth_mix::f16, synth_mix::bf16, synth_mix::q8_0, synth_mix::q4_0,
                        synth_mix::q6_k, synth_mix::q4_k_m, synth_mix::iq4_xs, synth_mix::mxfp4}) {
    const llm m = load_llm(gguf_file::open(synth_fixture(shape, mix)));
    kv_cache_storage cache = cache_of(m, 4, 16);
    const std::vector<std::int32_t> table = {0, 1, 2, 3};
    const auto logits = run_all(m, some_tokens(20, 1), 20, table, cache);
    ASSERT_EQ(logits.size(), std::size_t(20 * m.hp.n_vocab));
    double sum = 0, sq = 0;
    for (float x : logits) {
      ASSERT_TRUE(std::isfinite(x)) << shape << " " << synth_mix_name(mix);
      sum += x;
      sq += double(x) * x;
    }
    const double stddev = std::sqrt(sq / logits.size() - (sum / logits.size()) * (sum / logits.size()));
    EXPECT_GT(stddev, 0.1) << shape << " " << synth_mix_name(mix);
    EXPECT_LT(stddev, 100.0) << shape << " " << synth_mix_name(mix);
  }
}

// tiny-gpt-oss: 37 tokens pass its window of 16 on layer 0, with sinks on both layers.
// tiny-qwen35: its recurrent layers' state carried from step to step.
// tiny-mistral3: its queries' temperature from position 32 on.
TEST_P(CpuForwardShape, ChunkedPrefillAndDecodeMatchOneShotPrefill) {
  const char* shape = GetParam();
  const llm m = load_llm(gguf_file::open(synth_fixture(shape, synth_mix::f32)));
  const auto tokens = some_tokens(37, 2);
  const std::vector<std::int32_t> table = {0, 1, 2, 3, 4};
  kv_cache_storage a = cache_of(m, 5, 8), b = cache_of(m, 5, 8), c = cache_of(m, 5, 8);
  const auto one_shot = run_all(m, tokens, 37, table, a);
  EXPECT_LT(max_rel_diff(run_all(m, tokens, 5, table, b), one_shot), 1e-5) << shape;  // chunks of 5
  EXPECT_LT(max_rel_diff(run_all(m, tokens, 1, table, c), one_shot), 1e-5) << shape;  // decode steps
}

INSTANTIATE_TEST_SUITE_P(Synth, CpuForwardShape,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3", "tiny-qwen2moe", "tiny-qwen3moe",
                                           "tiny-mixtral", "tiny-gpt-oss", "tiny-gemma3", "tiny-qwen35",
                                           "tiny-qwen35moe", "tiny-mistral3", "tiny-gemma4", "tiny-gemma4moe",
                                           "tiny-gemma4e"),
                         [](const ::testing::TestParamInfo<const char*>& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(CpuForward, Mistral3QueriesTemperatureActsFromTheOriginalContextOn) {
  const std::string path = synth_fixture("tiny-mistral3", synth_mix::f32);
  const llm m = load_llm(gguf_file::open(path));
  llm plain = load_llm(gguf_file::open(path));
  plain.hp.attn_temp_scale = 0;
  const auto tokens = some_tokens(48, 3);
  const std::vector<std::int32_t> table = {0, 1, 2};
  kv_cache_storage a = cache_of(m, 3, 16), b = cache_of(plain, 3, 16);
  const auto with = run_all(m, tokens, 48, table, a), without = run_all(plain, tokens, 48, table, b);
  const auto n_vocab = std::size_t(m.hp.n_vocab);
  const std::vector<float> head(with.begin(), with.begin() + 32 * n_vocab), rest(with.begin() + 32 * n_vocab, with.end());
  EXPECT_EQ(head, std::vector<float>(without.begin(), without.begin() + 32 * n_vocab)) << "positions 0-31: a temperature of 1";
  EXPECT_GT(max_rel_diff(rest, std::vector<float>(without.begin() + 32 * n_vocab, without.end())), 1e-3);
}

// An 8-bit cache (kernels/kv_quant.h): chunking does not change what is stored, so chunked prefill
// and decode give the one-shot logits; a block copied (copy-on-write) carries its codes and scales;
// the logits stay near the exact cache's without equalling them.
TEST(CpuForward, An8BitCacheChunksCopiesAndStaysNearTheExactOne) {
  for (const kernels::kv_dtype t : {kernels::kv_dtype::int8, kernels::kv_dtype::fp8}) {
    SCOPED_TRACE(std::string(kernels::kv_dtype_name(t)));
    const llm m = load_llm(gguf_file::open(synth_fixture("tiny-qwen3", synth_mix::f32)));
    const auto tokens = some_tokens(37, 5);
    const std::vector<std::int32_t> table = {0, 1, 2, 3, 4};
    kv_cache_storage exact(m.hp, 5, 8), a(m.hp, 5, 8, t), b(m.hp, 5, 8, t), c(m.hp, 5, 8, t);
    EXPECT_EQ(a.dtype(), t);
    EXPECT_LT(a.bytes() * 3, exact.bytes()) << "8-bit rows take a quarter of the f32 ones, plus a scale each";
    EXPECT_EQ(a.bytes(), kv_cache_storage::bytes_per_block(m.hp, 8, t) * 5);
    const auto one_shot = run_all(m, tokens, 37, table, a);
    EXPECT_LT(max_rel_diff(run_all(m, tokens, 5, table, b), one_shot), 1e-5);
    EXPECT_LT(max_rel_diff(run_all(m, tokens, 1, table, c), one_shot), 1e-5);
    const double gap = max_rel_diff(one_shot, run_all(m, tokens, 37, table, exact));
    EXPECT_GT(gap, 0.);
    EXPECT_LT(gap, t == kernels::kv_dtype::int8 ? 0.02 : 0.1);
    std::printf("  %s cache: largest logit difference %.4f of the largest logit\n",
                std::string(kernels::kv_dtype_name(t)).c_str(), gap);

    // Copy-on-write: positions 0..15 (blocks 0, 1) copied to blocks 3, 4 of a fresh cache's
    // twin; one more token decoded over the copy gives the same logits as over the original.
    kv_cache_storage orig(m.hp, 6, 8, t);
    const auto prefix = std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 16);
    run_all(m, prefix, 16, {0, 1, 5}, orig);
    kv_cache_storage twin = orig;
    twin.copy_block(0, 3);
    twin.copy_block(1, 4);
    twin.copy_block(2, 0);  // clobber the originals so only the copies hold the prefix
    twin.copy_block(2, 1);
    cpu_forward fwd(m);
    std::vector<float> want, got;
    const std::vector<std::int32_t> next = {tokens[16]}, t_orig = {0, 1, 5}, t_copy = {3, 4, 5};
    const forward_seq s_orig{next, 16, t_orig, false}, s_copy{next, 16, t_copy, false};
    fwd.run(std::span(&s_orig, 1), orig, want);
    fwd.run(std::span(&s_copy, 1), twin, got);
    EXPECT_EQ(got, want);
  }
}

// A mixture of experts too: a token's experts and their sums do not depend on the other tokens
// routed with it.
// And a recurrent layer's state: each sequence keeps to its slot.
TEST(CpuForward, BatchingAndBlockPlacementDoNotChangeLogits) {
  for (const char* shape : {"tiny-qwen3", "tiny-qwen3moe", "tiny-qwen35"}) {
    SCOPED_TRACE(shape);
    const llm m = load_llm(gguf_file::open(synth_fixture(shape, synth_mix::f32)));
    const auto ta = some_tokens(21, 3), tb = some_tokens(9, 4);
    kv_cache_storage alone = cache_of(m, 3, 8);
    const auto ref_a = run_all(m, ta, 21, {0, 1, 2}, alone);

    // Both sequences in one cache with interleaved, out-of-order blocks (and swapped state
    // slots); B prefills while A prefills its first 13 tokens, then A finishes its prompt while B
    // decodes one token.
    kv_cache_storage shared = cache_of(m, 6, 8);
    const std::vector<std::int32_t> table_a = {5, 1, 3}, table_b = {4, 0};
    const std::int32_t slot_a = m.hp.has_recurrent() ? 1 : -1, slot_b = m.hp.has_recurrent() ? 0 : -1;
    cpu_forward fwd(m);
    std::vector<float> logits;
    const forward_seq step1[] = {
        {.tokens = std::span(ta).subspan(0, 13), .start_pos = 0, .block_table = table_a, .all_logits = true, .state_slot = slot_a},
        {.tokens = std::span(tb).subspan(0, 8), .start_pos = 0, .block_table = table_b, .state_slot = slot_b}};
    fwd.run(step1, shared, logits);
    ASSERT_EQ(logits.size(), std::size_t((13 + 1) * m.hp.n_vocab));
    std::vector<float> got_a(logits.begin(), logits.begin() + 13 * m.hp.n_vocab);
    const forward_seq step2[] = {
        {.tokens = std::span(tb).subspan(8, 1), .start_pos = 8, .block_table = table_b, .state_slot = slot_b},
        {.tokens = std::span(ta).subspan(13), .start_pos = 13, .block_table = table_a, .all_logits = true, .state_slot = slot_a}};
    fwd.run(step2, shared, logits);
    ASSERT_EQ(logits.size(), std::size_t((1 + 8) * m.hp.n_vocab));
    got_a.insert(got_a.end(), logits.begin() + m.hp.n_vocab, logits.end());
    EXPECT_LT(max_rel_diff(got_a, ref_a), 1e-5);
  }
}

TEST(CpuForward, RejectsMalformedBatches) {
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny", synth_mix::f32)));
  kv_cache_storage cache(m.hp, 2, 4);
  cpu_forward fwd(m);
  std::vector<float> logits;
  const std::vector<std::int32_t> ok = {1, 2}, bad_id = {1, 600}, table = {0, 1}, bad_table = {0, 7};
  const forward_seq id_seq{bad_id, 0, table, false};
  EXPECT_THROW(fwd.run(std::span(&id_seq, 1), cache, logits), std::invalid_argument);
  const forward_seq short_table{ok, 7, std::span(table).subspan(0, 1), false};
  EXPECT_THROW(fwd.run(std::span(&short_table, 1), cache, logits), std::invalid_argument);
  const forward_seq out_of_range{ok, 3, bad_table, false};
  EXPECT_THROW(fwd.run(std::span(&out_of_range, 1), cache, logits), std::invalid_argument);
  const forward_seq empty{{}, 0, table, false};
  EXPECT_THROW(fwd.run(std::span(&empty, 1), cache, logits), std::invalid_argument);
}

// The state slots: a step continues a slot only where the last one left it, one slot per sequence,
// in range, and none for a model without recurrent layers; a failed step leaves its slots unusable
// until a sequence starts afresh; a copied slot continues like the original.
TEST(CpuForward, RecurrentStateSlotsAreCheckedAndCopied) {
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny-qwen35", synth_mix::f32)));
  const auto tokens = some_tokens(12, 6);
  const std::vector<std::int32_t> table = {0, 1};
  kv_cache_storage cache = cache_of(m, 4, 8);
  EXPECT_EQ(cache.n_state_slots(), 2);
  EXPECT_EQ(cache.bytes() - kv_cache_storage::bytes_per_block(m.hp, 8) * 4,
            2 * kv_cache_storage::bytes_per_state_slot(m.hp) + 2 * sizeof(std::int64_t));
  cpu_forward fwd(m);
  std::vector<float> logits;
  const auto span = std::span(tokens);
  const forward_seq first{.tokens = span.first(8), .start_pos = 0, .block_table = table, .state_slot = 0};
  fwd.run(std::span(&first, 1), cache, logits);
  EXPECT_EQ(cache.state_pos(0), 8);
  const auto fails = [&](const forward_seq& s, const char* what) {
    try {
      fwd.run(std::span(&s, 1), cache, logits);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails({.tokens = span.subspan(9, 1), .start_pos = 9, .block_table = table, .state_slot = 0}, "holds 8 positions, the step starts at 9");
  fails({.tokens = span.subspan(8, 1), .start_pos = 8, .block_table = table, .state_slot = 1}, "holds 0 positions");
  fails({.tokens = span.subspan(8, 1), .start_pos = 8, .block_table = table, .state_slot = 2}, "out of range");
  fails({.tokens = span.subspan(8, 1), .start_pos = 8, .block_table = table}, "out of range");
  const std::vector<std::int32_t> other = {2, 3};
  const forward_seq twice[] = {{.tokens = span.subspan(8, 1), .start_pos = 8, .block_table = table, .state_slot = 0},
                               {.tokens = span.first(2), .start_pos = 0, .block_table = other, .state_slot = 0}};
  try {
    fwd.run(twice, cache, logits);
    ADD_FAILURE() << "one slot for two sequences was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is sequence 0's too"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.state_pos(0), 8) << "a refused step changes nothing";

  // The continuation from a copy of slot 0 in slot 1 equals the one from slot 0.
  cache.copy_state(0, 1);
  EXPECT_EQ(cache.state_pos(1), 8);
  kv_cache_storage twin = cache;
  const forward_seq next0{.tokens = span.subspan(8), .start_pos = 8, .block_table = table, .state_slot = 0};
  const forward_seq next1{.tokens = span.subspan(8), .start_pos = 8, .block_table = table, .state_slot = 1};
  std::vector<float> want;
  fwd.run(std::span(&next0, 1), cache, want);
  fwd.run(std::span(&next1, 1), twin, logits);
  EXPECT_EQ(logits, want);

  // A model without recurrent layers takes no slot.
  const llm dense = load_llm(gguf_file::open(synth_fixture("tiny-qwen3", synth_mix::f32)));
  kv_cache_storage plain(dense.hp, 2, 8);
  cpu_forward dense_fwd(dense);
  const forward_seq slotted{.tokens = span.first(2), .start_pos = 0, .block_table = table, .state_slot = 0};
  EXPECT_THROW(dense_fwd.run(std::span(&slotted, 1), plain, logits), std::invalid_argument);
  EXPECT_THROW(kv_cache_storage(m.hp, 2, 8), std::invalid_argument) << "recurrent layers need slots";
}

}  // namespace
