# anvil-bench (bench/load/). bench_core_test: the pure core, no sockets. bench_client_test: the
# clients and the run driver against fake servers on loopback (line protocol and HTTP SSE), in
# process through run_bench() and once through the built executable.
anvil_add_test(bench_core_test LABELS proto
  SOURCES
    bench/arrivals_test.cpp
    bench/stats_test.cpp
    bench/stream_parse_test.cpp
    bench/wire_test.cpp
    bench/report_test.cpp
    bench/options_test.cpp
  LIBS anvil_bench_core)

anvil_add_test(bench_client_test LABELS proto
  SOURCES
    bench/line_bench_test.cpp
    bench/http_bench_test.cpp
  LIBS anvil_bench_client)
target_compile_definitions(bench_client_test PRIVATE ANVIL_BENCH_EXE="$<TARGET_FILE:anvil-bench>")
add_dependencies(bench_client_test anvil-bench)
