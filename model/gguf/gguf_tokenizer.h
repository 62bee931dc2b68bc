// Tokenizer metadata in GGUF (`tokenizer.ggml.*`, `tokenizer.chat_template`): read into a
// tokenizer_spec the way real model files store it, and written back the same way by
// `anvil synth` and the test fixtures.
#pragma once

#include <string>

#include "model/gguf/gguf.h"
#include "model/tokenizer/tokenizer.h"

namespace anvil::model {

// Throws model_error when a key is missing or has the wrong type (the tokenizer itself then
// validates the contents: lengths, ids, byte tokens).
tokenizer_spec tokenizer_spec_from_gguf(const gguf_file& f);
std::string chat_template_from_gguf(const gguf_file& f);  // "" when the file has none

void write_tokenizer_metadata(gguf_writer& w, const tokenizer_spec& spec, const std::string& chat_template);

}  // namespace anvil::model
