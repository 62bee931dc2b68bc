// The OpenAI Node client against anvil's HTTP API: its function-calling, streamed tool-call and
// structured-output examples (tests/proto/openai-js/examples.mjs) run unchanged in shape against a
// real server. Tools: a tiny scripted model with Qwen2.5's template, which calls get_weather.
// Structured output: the shipped model with a ChatML template. The client comes from the npm
// registry (`npm ci --prefix tests/proto/openai-js`, which scripts/install-deps.sh runs).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "tests/proto/child_process.h"
#include "tests/proto/http_loopback.h"

namespace {

using namespace anvil;
using namespace anvil::http_loopback;
namespace fs = std::filesystem;

const fs::path client_dir = fs::path(ANVIL_SOURCE_DIR) / "tests" / "proto" / "openai-js";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << p;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `node` from PATH (the child is spawned without a shell).
std::string node_path() {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin";
  while (!dirs.empty()) {
    const std::size_t colon = dirs.find(':');
    const fs::path candidate = fs::path(dirs.substr(0, colon)) / "node";
    if (fs::exists(candidate)) return candidate.string();
    dirs = colon == std::string_view::npos ? std::string_view() : dirs.substr(colon + 1);
  }
  return {};
}

// Runs the examples of `mode` against the server; their output on failure.
void run_examples(const server& s, const std::string& mode) {
  const std::string node = node_path();
  ASSERT_FALSE(node.empty()) << "node is not installed (scripts/install-deps.sh installs it)";
  ASSERT_TRUE(fs::exists(client_dir / "node_modules" / "openai" / "package.json"))
      << "the OpenAI client is not installed: run 'npm ci --prefix tests/proto/openai-js' (scripts/install-deps.sh does)";
  anvil::testing::child c({node, (client_dir / "examples.mjs").string(), mode,
                           "http://127.0.0.1:" + std::to_string(s.port()) + "/v1"});
  const auto done = c.wait_for(std::regex("^(ok|FAIL): "), std::chrono::seconds(240));
  const int status = c.wait_exit(std::chrono::seconds(10));
  EXPECT_FALSE(done.empty()) << c.output();
  EXPECT_EQ(status, 0) << c.output();
  EXPECT_NE(c.output().find("ok: " + mode), std::string::npos) << c.output();
}

TEST(OpenAiClient, FunctionCallingExamples) {
  engine_config c = tiny_config();
  c.model_path = model::testing::scripted_chat_fixture(
      "openai-weather", read_file(fs::path(ANVIL_SOURCE_DIR) / "tests/data/chat/qwen2.5.jinja"),
      {"<tool_call>", "\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\"}}\n", "</tool_call>"});
  server s(c);
  run_examples(s, "tools");
  EXPECT_EQ(s.settled().kv.counts.in_use, 0);
}

TEST(OpenAiClient, StructuredOutputExamples) {
  engine_config c = tiny_config();
  c.model_path = (fs::path(ANVIL_SOURCE_DIR) / "models" / "anvil-kjv-q8_0.gguf").string();
  c.chat_template = read_file(fs::path(ANVIL_SOURCE_DIR) / "tests/data/chat/chatml.jinja");
  server s(c);
  run_examples(s, "structured");
  EXPECT_EQ(s.settled().kv.counts.in_use, 0);
}

}  // namespace
