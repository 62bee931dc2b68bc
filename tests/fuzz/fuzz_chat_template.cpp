// Fuzz target: the Jinja interpreter on arbitrary template sources (a model file's
// tokenizer.chat_template is attacker-controlled). Each input is parsed and, when it parses,
// rendered over a conversation with tools, a tool call and its answer, with and without the
// generation prompt. Checked: parsing and rendering either succeed or throw model_error (the
// engine turns that into a clear refusal); no other exception, crash, hang or huge allocation.
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "model/chat/chat_template.h"
#include "model/model_error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace anvil::model;
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  static const std::vector<chat_message> conversation = {
      {.role = "system", .content = "Be brief."},
      {.role = "user", .content = "Weather in Paris? \xc3\xa9\xf0\x9f\x91\x8b"},
      {.role = "assistant", .content = "", .content_is_null = true,
       .tool_calls_json = R"([{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}])"},
      {.role = "tool", .content = "{\"temp\": 21}", .tool_call_id = "call_1"},
      {.role = "assistant", .content = "<think>x</think>It is 21.", .reasoning_content = "x"}};
  constexpr std::string_view tools =
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
  try {
    const chat_template t(source, "<s>", "</s>");
    for (const bool gen : {false, true}) {
      try {
        (void)t.render(chat_inputs{.messages = conversation, .add_generation_prompt = gen, .tools_json = tools,
                                   .template_kwargs_json = R"({"enable_thinking": false})"});
      } catch (const model_error&) {
      }
    }
  } catch (const model_error&) {
  }
  return 0;
}
