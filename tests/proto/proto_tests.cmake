# proto/ suites (label proto): the request codec, and the TCP line protocol over loopback.
anvil_add_test(proto_codec_test LABELS proto
  SOURCES proto/request_json_test.cpp
  LIBS anvil_proto)

anvil_add_test(proto_line_test LABELS proto TIMEOUT 300
  SOURCES proto/line_server_test.cpp
  LIBS anvil_proto anvil_model)

# `anvil serve` run as a process, and anvil-bench measuring it.
anvil_add_test(proto_serve_test LABELS proto TIMEOUT 300
  SOURCES proto/serve_test.cpp
  LIBS anvil_model Boost::json)
target_compile_definitions(proto_serve_test PRIVATE ANVIL_EXE="$<TARGET_FILE:anvil>"
                                                  ANVIL_BENCH_EXE="$<TARGET_FILE:anvil-bench>")
add_dependencies(proto_serve_test anvil anvil-bench)
