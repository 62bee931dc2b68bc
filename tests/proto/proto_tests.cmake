# proto/ suites (label proto): the request codec, and the TCP line protocol over loopback.
anvil_add_test(proto_codec_test LABELS proto
  SOURCES proto/request_json_test.cpp
  LIBS anvil_proto)

anvil_add_test(proto_line_test LABELS proto TIMEOUT 300
  SOURCES proto/line_server_test.cpp
  LIBS anvil_proto anvil_model)
