# anvil_chat: chat templates (model/chat_template.*), recognised by content and rendered in C++.
add_library(anvil_chat STATIC ${CMAKE_CURRENT_SOURCE_DIR}/chat_template.cpp)
target_include_directories(anvil_chat PUBLIC ${PROJECT_SOURCE_DIR})
anvil_target_defaults(anvil_chat)
