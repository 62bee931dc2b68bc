# Chat templates against the goldens rendered from the real templates (tools/chat/render_goldens.py);
# Boost.JSON reads tests/data/chat/goldens.json.
anvil_add_test(chat_template_test LABELS model SOURCES model/chat_template_test.cpp model/chat_output_test.cpp
  LIBS anvil_chat Boost::json)
target_compile_definitions(chat_template_test PRIVATE ANVIL_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
