// Import of Hugging Face tokenizer files (tokenizer.json + tokenizer_config.json) into a
// tokenizer_spec, the way llama.cpp's convert_hf_to_gguf.py fills the GGUF tokenizer.* keys, so
// a model can be tested (and run) with the tokenizer it was published with:
//  - tokens by id, added tokens included; holes become "[PAD<id>]" unused tokens;
//  - token types: special added tokens (and ones that look special, "<|...|>") are control, the
//    unk token unknown, other added tokens user-defined, "<0xHH>" tokens byte (SentencePiece);
//  - merges in either serialisation ("a b" strings or ["a", "b"] pairs);
//  - byte-level BPE files become model "gpt2" with pre "llama-bpe", "qwen2" or "gpt-4o",
//    recognised by their pre-tokenizer regex; SentencePiece-style BPE files (byte_fallback, U+2581 spaces)
//    become model "llama", with merge ranks turned into scores (see tokenizer_json.cpp);
//  - bos/eos/pad/unk from tokenizer_config.json, add_bos/add_eos from it or from the
//    post-processor template; eot/eom by the token names llama.cpp looks for.
// Anything that cannot be converted faithfully throws model_error naming the file and the field.
#pragma once

#include <string>

#include "model/tokenizer/tokenizer.h"

namespace anvil::model {

// tokenizer_config_path may be empty: then bos/eos come from the post-processor template only.
tokenizer_spec spec_from_hf_json(const std::string& tokenizer_json_path, const std::string& tokenizer_config_path);

// The "chat_template" of a tokenizer_config.json ("default" one if it holds several); "" if none.
std::string chat_template_from_hf_config(const std::string& tokenizer_config_path);

}  // namespace anvil::model
