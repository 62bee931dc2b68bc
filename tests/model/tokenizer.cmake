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
    model/tokenizer_golden_test.cpp
  LIBS anvil_tokenizer Boost::json)
target_compile_definitions(tokenizer_test PRIVATE ANVIL_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
