# Tokenizer suite. The golden tests read the reference tokenizers fetched by
# scripts/fetch-tokenizers.sh into tests/data/tokenizers/ and the goldens committed in
# tests/data/tokenizer/; they fail (not skip) when the fetched files are missing.
anvil_add_test(tokenizer_test LABELS tokenizer
  SOURCES
    model/tokenizer_spec_test.cpp
    model/tokenizer_bpe_test.cpp
    model/tokenizer_spm_test.cpp
    model/tokenizer_decoder_test.cpp
    model/tokenizer_unicode_test.cpp
    model/tokenizer_json_test.cpp
    model/tokenizer_harmony_test.cpp
    model/tokenizer_golden_test.cpp
  LIBS anvil_tokenizer Boost::json)
target_compile_definitions(tokenizer_test PRIVATE ANVIL_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")

# The same goldens through the GGUF path (tokenizer_spec_from_gguf, in anvil_model): gpt-oss's
# vocabulary written as llama.cpp's converter writes it, then read back.
anvil_add_test(tokenizer_gguf_test LABELS "tokenizer;gguf"
  SOURCES model/tokenizer_gguf_test.cpp
  LIBS anvil_model Boost::json)
target_compile_definitions(tokenizer_gguf_test PRIVATE ANVIL_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
