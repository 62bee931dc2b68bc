#include "tests/fuzz/load_model.h"

#include "model/arch/cpu_forward.h"
#include "model/gguf/gguf_tokenizer.h"

namespace anvil::fuzz {

loaded_model load_model(std::span<const std::byte> bytes) {
  model::gguf_file file = model::gguf_file::parse(bytes);
  // cli/cmd_generate.cpp sizes the KV pool from the hyper-parameters before the engine loads.
  const model::hparams hp = model::read_hparams(file);
  (void)model::kv_cache_storage::bytes_per_block(hp, 16);
  // engine/engine.cpp: weights, tokenizer, chat template.
  model::llm llm = model::load_llm(std::move(file));
  model::tokenizer tok(model::tokenizer_spec_from_gguf(llm.file));
  std::optional<model::chat_template> chat;
  const std::string tmpl = model::chat_template_from_gguf(llm.file);
  const auto piece = [&](std::int32_t id) { return id >= 0 ? tok.token_piece(id) : std::string(); };
  if (!tmpl.empty()) {
    try {
      chat.emplace(tmpl, piece(tok.bos()), piece(tok.eos()));
    } catch (const model::model_error&) {  // the engine refuses chats then, and serves completions
    }
  }
  return {std::move(llm), std::move(tok), std::move(chat)};
}

}  // namespace anvil::fuzz
