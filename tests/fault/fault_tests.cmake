# Reliability suites (label fault): device faults through the fault-injection hook, KV exhaustion
# under oversubscription, sampling determinism and cancellation, at the engine level (also label
# engine) and against `anvil serve` as a process.
# The worker's own fault paths: the injection hook, and the worker shell over a device that queues
# steps (refused or failed steps answered in order behind those on the device).
anvil_add_test(fault_injection_test LABELS fault
  SOURCES fault/fault_injection_test.cpp gpu_worker/worker_shell_test.cpp
  LIBS anvil_gpu_worker)

anvil_add_test(engine_fault_test LABELS "engine;fault" TIMEOUT 300
  SOURCES fault/engine_fault_test.cpp fault/kv_exhaustion_test.cpp fault/determinism_test.cpp
  LIBS anvil_engine)

# `anvil serve` as a process, with a fault injected through ANVIL_FAULT_INJECT.
anvil_add_test(serve_fault_test LABELS fault TIMEOUT 300
  SOURCES fault/serve_fault_test.cpp
  LIBS anvil_model Boost::json)
target_compile_definitions(serve_fault_test PRIVATE ANVIL_EXE="$<TARGET_FILE:anvil>")
add_dependencies(serve_fault_test anvil)
