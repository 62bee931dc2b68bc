// Fuzz target: a GGUF file from bytes, through every step `anvil generate -m` takes (load_model.h),
// then, when it loads, one forward step and a round of the tokenizer and chat template. Anything
// but a model_error from the load — another exception, a crash, a sanitizer report — is a bug.
#include <cstdint>
#include <cstdlib>

#include "model/arch/cpu_forward.h"
#include "tests/fuzz/load_model.h"

namespace {

void exercise(const anvil::fuzz::loaded_model& m) {
  using namespace anvil::model;
  const std::vector<std::int32_t> ids = m.tok.encode("ab c\n<|im_start|>A", true, true);
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= m.tok.n_vocab()) std::abort();  // the tokenizer produced an id it cannot decode
  }
  (void)m.tok.decode(ids);
  if (m.chat) {
    try {  // a template may raise for a conversation; that is a clean error, never a crash
      (void)m.chat->render(std::vector<chat_message>{{"user", "ab"}}, true);
    } catch (const model_error&) {
    }
  }

  // The loader vouches that every weight it hands out lies inside the file: read them all once.
  const bool recurrent = m.llm.hp.has_recurrent();  // one state slot for it
  kv_cache_storage cache(m.llm.hp, 1, 16, anvil::kernels::kv_dtype::f16, std::pmr::get_default_resource(), 0, recurrent ? 1 : 0);
  cpu_forward fwd(m.llm, 1);
  const std::int32_t token[1] = {0};
  const std::int32_t block[1] = {0};
  forward_seq seq;
  seq.tokens = token;
  seq.block_table = block;
  seq.state_slot = recurrent ? 0 : -1;
  std::vector<float> logits;
  fwd.run(std::span(&seq, 1), cache, logits);
  if (logits.size() != std::size_t(m.llm.hp.n_vocab)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::optional<anvil::fuzz::loaded_model> m;
  try {
    m.emplace(anvil::fuzz::load_model({reinterpret_cast<const std::byte*>(data), size}));
  } catch (const anvil::model::model_error&) {
    return 0;  // refused cleanly
  }
  exercise(*m);
  return 0;
}
