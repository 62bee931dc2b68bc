# kv_test: the KV-cache manager. The core suites need no Asio; kv_manager_test drives the actor
# shell through use_future (run it under TSan too).
anvil_add_test(kv_test LABELS kv
  SOURCES
    kv/kv_core_test.cpp
    kv/kv_prefix_test.cpp
    kv/kv_fork_test.cpp
    kv/kv_apply_test.cpp
    kv/kv_check_test.cpp
    kv/kv_stress_test.cpp
    kv/kv_window_test.cpp
    kv/kv_state_slot_test.cpp
    kv/kv_state_snapshot_test.cpp
    kv/kv_manager_test.cpp
  LIBS anvil_kv)
