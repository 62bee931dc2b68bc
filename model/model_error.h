// model_error: what loading or validating a model (GGUF file, tokenizer, chat template,
// architecture) throws. Thrown only at the model-load edge and converted there into a clean
// error for the user; the message names the problem ("tensor 'blk.0.attn_q.weight': offset
// 1234 past the end of the file").
#pragma once

#include <stdexcept>
#include <string>

namespace anvil::model {

class model_error : public std::runtime_error {
 public:
  explicit model_error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace anvil::model
