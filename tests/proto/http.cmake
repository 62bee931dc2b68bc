# The OpenAI-compatible HTTP API over loopback against a real engine on a tiny synthetic model,
# and its Prometheus text. Generous timeout: the disconnect and overload cases run long requests.
# http_tools_test: tools, tool calls and reasoning through real chat templates (tests/data/chat).
# The loopback client (Beast) is compiled once for both suites.
add_library(anvil_http_loopback STATIC proto/http_loopback.cpp)
target_include_directories(anvil_http_loopback PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(anvil_http_loopback PUBLIC anvil_proto)
anvil_target_defaults(anvil_http_loopback)
anvil_add_test(proto_http_test LABELS proto
  SOURCES proto/metrics_text_test.cpp proto/http_session_test.cpp proto/http_test.cpp proto/http_tools_test.cpp
          proto/http_fields_test.cpp
  LIBS anvil_http_loopback
  TIMEOUT 600)
target_compile_definitions(proto_http_test PRIVATE ANVIL_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
# The OpenAI Node client's examples against the server (tests/proto/openai-js, installed by
# `npm ci --prefix tests/proto/openai-js`).
anvil_add_test(proto_openai_client_test LABELS proto
  SOURCES proto/openai_client_test.cpp
  LIBS anvil_http_loopback
  TIMEOUT 300)
target_compile_definitions(proto_openai_client_test PRIVATE ANVIL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
