// The steps `anvil generate -m FILE` and the engine take on a model file, in their order, from
// bytes in memory: header and metadata (gguf_file), the hyper-parameters and the KV-cache size
// generate derives from them, the weights (load_llm), the tokenizer and the chat template. What a
// fuzz target runs per input; the hostile-file suite runs the real engine::create on files.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "model/chat/chat_template.h"
#include "model/arch/llm.h"
#include "model/tokenizer/tokenizer.h"

namespace anvil::fuzz {

struct loaded_model {
  model::llm llm;
  model::tokenizer tok;
  std::optional<model::chat_template> chat;  // when the file has a template that parses
};

// Throws model_error naming the problem when the bytes are not a model anvil can run.
loaded_model load_model(std::span<const std::byte> bytes);

}  // namespace anvil::fuzz
