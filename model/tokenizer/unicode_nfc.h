// Unicode Normalization Form C, for the tokenizers whose reference implementation normalises
// input to NFC before pre-tokenisation (Qwen2's tokenizer.json has "normalizer": NFC). Without
// it, decomposed input ("e" + U+0301) tokenises differently from what the model was trained on.
// Tables: unicode_nfc_data.cpp (generated; Unicode version noted there).
#pragma once

#include <string>
#include <string_view>

namespace anvil::model {

// Returns text in NFC. Bytes that are not well-formed UTF-8 are copied through unchanged and act
// as starters that nothing composes with.
std::string to_nfc(std::string_view text);

}  // namespace anvil::model
