# The OpenAI-compatible HTTP API (HTTP.md): Beast stays in http_server.cpp; the session, the JSON
# shapes and the Prometheus text are plain C++.
target_sources(anvil_proto PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/http_server.cpp
  ${CMAKE_CURRENT_LIST_DIR}/http_session.cpp
  ${CMAKE_CURRENT_LIST_DIR}/openai_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics_text.cpp)
target_link_libraries(anvil_proto PUBLIC Boost::headers)
