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

# Reliability (issue 7), against both servers in process on a tiny model: seeded hostile input on
# both protocols, slow and half-open clients, values at the edges, a client going away at every
# stage of its request, and the API key on every endpoint. TSan-clean (run under -L proto).
anvil_add_test(proto_abuse_test LABELS "proto;fault" TIMEOUT 600
  SOURCES
    proto/line_abuse_test.cpp
    proto/http_abuse_test.cpp
    proto/slow_client_test.cpp
    proto/limits_test.cpp
    proto/disconnect_test.cpp
    proto/auth_test.cpp
    proto/connection_limit_test.cpp
  LIBS anvil_proto anvil_model)

# The soak (label soak): mixed traffic against a real `anvil serve` for ANVIL_SOAK_SECONDS (default
# 75; it runs in the normal and the ASan ctest), checking the KV ledger throughout and flat memory,
# no leaked descriptors, nothing live at the end.
anvil_add_test(proto_soak_test LABELS soak TIMEOUT 900
  SOURCES proto/soak_test.cpp
  LIBS anvil_model Boost::json)
target_compile_definitions(proto_soak_test PRIVATE ANVIL_EXE="$<TARGET_FILE:anvil>")
add_dependencies(proto_soak_test anvil)
