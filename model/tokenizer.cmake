# anvil_tokenizer: tokenizers from GGUF metadata (byte-level BPE, SentencePiece-style BPE) and
# the HF tokenizer.json import. PCRE2 runs the pre-tokenizer regexes; Boost.JSON reads
# tokenizer.json. Neither appears in the public headers, so both link privately.
add_library(anvil_tokenizer STATIC
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_validate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bpe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_spm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pretokenize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unicode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unicode_nfc.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unicode_nfc_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json_pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json_special.cpp)
target_include_directories(anvil_tokenizer PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(anvil_tokenizer PRIVATE PkgConfig::PCRE2 Boost::json)
anvil_target_defaults(anvil_tokenizer)
