anvil_add_test(sched_test LABELS sched
  SOURCES sched/scheduler_core_test.cpp sched/scheduler_actor_test.cpp
  LIBS anvil_sched)
# The 1,000-request test takes ~4 s optimised and ~90 s under ASan.
anvil_add_test(engine_test LABELS engine
  SOURCES engine/engine_test.cpp engine/engine_edges_test.cpp engine/request_stream_test.cpp
          engine/structured_output_test.cpp
  LIBS anvil_engine
  TIMEOUT 600)
