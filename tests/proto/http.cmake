# The OpenAI-compatible HTTP API over loopback against a real engine on a tiny synthetic model,
# and its Prometheus text. Generous timeout: the disconnect and overload cases run long requests.
anvil_add_test(proto_http_test LABELS proto
  SOURCES proto/metrics_text_test.cpp proto/http_session_test.cpp proto/http_test.cpp
  LIBS anvil_proto
  TIMEOUT 600)
