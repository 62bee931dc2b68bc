// The OpenAI-compatible HTTP API over loopback, against a real engine on a tiny random-weight
// model with a ChatML template: response shapes, SSE streaming, chat, n > 1, logprobs, models,
// health, metrics, tokenize, errors of every kind (the server answering correctly afterwards),
// API keys, overload, and client disconnects that must give every KV block back.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/arch/synth.h"
#include "proto/http_server.h"
#include "tests/proto/http_loopback.h"
#include "tests/proto/prometheus_samples.h"
#include "tests/model/fixtures.h"
#include "tests/scratch_dir.h"

namespace {

using namespace anvil;
using namespace anvil::http_loopback;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

json::object greedy_completion(std::int64_t max_tokens) {
  return json::object{{"model", "whatever"}, {"prompt", "Hello there"}, {"max_tokens", max_tokens},
                      {"temperature", 0}, {"ignore_eos", true}};
}

void expect_openai_error(const reply& r, unsigned status, std::string_view type) {
  EXPECT_EQ(r.status, status) << r.body;
  json::error_code ec;
  const json::value v = json::parse(r.body, ec);
  ASSERT_FALSE(ec) << r.body;
  const json::object* err = v.as_object().if_contains("error") ? &v.at("error").as_object() : nullptr;
  ASSERT_TRUE(err) << r.body;
  EXPECT_TRUE(err->at("message").is_string());
  EXPECT_EQ(err->at("type").as_string(), type) << r.body;
  EXPECT_TRUE(err->contains("param"));
  EXPECT_TRUE(err->contains("code"));
}

TEST(HttpApi, HealthSaysLoadingUntilTheEngineIsSet) {
  server s(std::nullopt);
  reply h = s.get("/health");
  EXPECT_EQ(h.status, 503u);
  EXPECT_EQ(h.json().at("status").as_string(), "loading");
  expect_openai_error(s.post("/v1/completions", greedy_completion(2)), 503, "server_error");
  expect_openai_error(s.get("/v1/models"), 503, "server_error");

  s.eng = engine::create(tiny_config());
  s.srv->set_engine(s.eng);
  h = s.get("/health");
  EXPECT_EQ(h.status, 200u);
  EXPECT_EQ(h.json().at("status").as_string(), "ok");
  EXPECT_EQ(s.post("/v1/completions", greedy_completion(2)).status, 200u);
}

TEST(HttpApi, CompletionHasOpenAIShape) {
  server s;
  const reply r = s.post("/v1/completions", greedy_completion(5));
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.content_type, "application/json");
  const json::object o = r.json().as_object();
  EXPECT_EQ(o.at("id").as_string().subview().substr(0, 5), "cmpl-");
  EXPECT_EQ(o.at("object").as_string(), "text_completion");
  EXPECT_TRUE(o.at("created").is_int64());
  EXPECT_EQ(o.at("model").as_string(), s.eng->model_name());
  const json::array& choices = o.at("choices").as_array();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].at("index").as_int64(), 0);
  EXPECT_TRUE(choices[0].at("text").is_string());
  EXPECT_TRUE(choices[0].at("logprobs").is_null());
  EXPECT_EQ(choices[0].at("finish_reason").as_string(), "length");
  const json::object& u = o.at("usage").as_object();
  EXPECT_EQ(u.at("completion_tokens").as_int64(), 5);
  EXPECT_GT(u.at("prompt_tokens").as_int64(), 0);
  EXPECT_EQ(u.at("total_tokens").as_int64(), u.at("prompt_tokens").as_int64() + 5);

  json::object echo = greedy_completion(3);
  echo["echo"] = true;
  const reply e = s.post("/v1/completions", echo);
  ASSERT_EQ(e.status, 200u) << e.body;
  const std::string text(e.json().at("choices").at(0).at("text").as_string());
  EXPECT_EQ(text.rfind("Hello there", 0), 0u) << text;
}

TEST(HttpApi, StreamedChunksConcatenateToTheNonStreamedText) {
  server s;
  const reply whole = s.post("/v1/completions", greedy_completion(24));
  ASSERT_EQ(whole.status, 200u) << whole.body;
  const std::string expected(whole.json().at("choices").at(0).at("text").as_string());

  json::object req = greedy_completion(24);
  req["stream"] = true;
  req["stream_options"] = json::object{{"include_usage", true}};
  const reply r = s.post("/v1/completions", req);
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.content_type, "text/event-stream");
  EXPECT_EQ(r.header("Transfer-Encoding"), "chunked");
  const auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  std::string id;
  for (std::size_t i = 0; i + 2 < events.size(); ++i) {
    const json::object c = json::parse(events[i]).as_object();
    EXPECT_EQ(c.at("object").as_string(), "text_completion");
    if (id.empty()) id = c.at("id").as_string();
    EXPECT_EQ(c.at("id").as_string(), id);
    const json::object& ch = c.at("choices").at(0).as_object();
    EXPECT_TRUE(finish.empty()) << "a chunk after the finish";
    text += ch.at("text").as_string();
    if (!ch.at("finish_reason").is_null()) finish = ch.at("finish_reason").as_string();
  }
  EXPECT_EQ(text, expected);
  EXPECT_EQ(finish, "length");
  const json::object usage_chunk = json::parse(events[events.size() - 2]).as_object();
  EXPECT_TRUE(usage_chunk.at("choices").as_array().empty());
  EXPECT_EQ(usage_chunk.at("usage").at("completion_tokens").as_int64(), 24);
}

TEST(HttpApi, ChatCompletionsRenderTheTemplate) {
  server s;
  const json::array messages{json::object{{"role", "system"}, {"content", "Be brief."}},
                             json::object{{"role", "user"}, {"content", "Hi!"}}};
  json::object req{{"model", "x"}, {"messages", messages}, {"max_tokens", 6}, {"temperature", 0}};
  const reply r = s.post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200u) << r.body;
  const json::object o = r.json().as_object();
  EXPECT_EQ(o.at("id").as_string().subview().substr(0, 9), "chatcmpl-");
  EXPECT_EQ(o.at("object").as_string(), "chat.completion");
  const json::object& msg = o.at("choices").at(0).at("message").as_object();
  EXPECT_EQ(msg.at("role").as_string(), "assistant");
  const std::string content(msg.at("content").as_string());

  // The prompt is the rendered conversation: /tokenize with the same messages counts the same.
  const reply t = s.post("/tokenize", json::object{{"messages", messages}});
  ASSERT_EQ(t.status, 200u) << t.body;
  EXPECT_EQ(o.at("usage").at("prompt_tokens").as_int64(), t.json().at("count").as_int64());

  req["stream"] = true;
  const reply st = s.post("/v1/chat/completions", req);
  ASSERT_EQ(st.status, 200u) << st.body;
  const auto events = sse_data(st.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json::object first = json::parse(events[0]).as_object();
  EXPECT_EQ(first.at("object").as_string(), "chat.completion.chunk");
  EXPECT_EQ(first.at("choices").at(0).at("delta").at("role").as_string(), "assistant");
  EXPECT_EQ(streamed_chat(events).content, content);
}

TEST(HttpApi, NChoicesAreIndexedAndSeededApart) {
  server s;
  json::object req{{"prompt", "Once"}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 5}, {"n", 2}, {"ignore_eos", true}};
  const reply r = s.post("/v1/completions", req);
  ASSERT_EQ(r.status, 200u) << r.body;
  const json::array& ch = r.json().at("choices").as_array();
  ASSERT_EQ(ch.size(), 2u);
  EXPECT_EQ(ch[0].at("index").as_int64(), 0);
  EXPECT_EQ(ch[1].at("index").as_int64(), 1);
  EXPECT_NE(ch[0].at("text"), ch[1].at("text"));
  EXPECT_EQ(r.json().at("usage").at("completion_tokens").as_int64(), 24);

  // The same seeds streamed: chunks interleave by index and add up to the same two texts.
  req["stream"] = true;
  const auto events = sse_data(s.post("/v1/completions", req).body);
  std::string text[2];
  int finishes = 0;
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    const json::value chunk = json::parse(e);
    const json::object& c = chunk.at("choices").at(0).as_object();
    text[c.at("index").as_int64()] += c.at("text").as_string();
    finishes += !c.at("finish_reason").is_null();
  }
  EXPECT_EQ(finishes, 2);
  EXPECT_EQ(text[0], ch[0].at("text").as_string());
  EXPECT_EQ(text[1], ch[1].at("text").as_string());
}

TEST(HttpApi, LogprobsInBothShapes) {
  server s;
  json::object req = greedy_completion(4);
  req["logprobs"] = 2;
  const reply r = s.post("/v1/completions", req);
  ASSERT_EQ(r.status, 200u) << r.body;
  const json::object& lp = r.json().at("choices").at(0).at("logprobs").as_object();
  ASSERT_EQ(lp.at("tokens").as_array().size(), 4u);
  ASSERT_EQ(lp.at("token_logprobs").as_array().size(), 4u);
  ASSERT_EQ(lp.at("text_offset").as_array().size(), 4u);
  ASSERT_EQ(lp.at("top_logprobs").as_array().size(), 4u);
  EXPECT_LE(lp.at("token_logprobs").at(0).to_number<double>(), 0.0);
  EXPECT_EQ(lp.at("text_offset").at(0).to_number<std::int64_t>(), 0);
  EXPECT_GE(lp.at("top_logprobs").at(0).as_object().size(), 1u);

  json::object chat{{"messages", json::array{json::object{{"role", "user"}, {"content", "Hi"}}}},
                    {"max_tokens", 3}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}, {"ignore_eos", true}};
  const reply c = s.post("/v1/chat/completions", chat);
  ASSERT_EQ(c.status, 200u) << c.body;
  const json::array& content = c.json().at("choices").at(0).at("logprobs").at("content").as_array();
  ASSERT_EQ(content.size(), 3u);
  for (const json::value& t : content) {
    EXPECT_TRUE(t.at("token").is_string());
    EXPECT_LE(t.at("logprob").to_number<double>(), 0.0);
    EXPECT_TRUE(t.at("bytes").is_array());
    EXPECT_EQ(t.at("top_logprobs").as_array().size(), 2u);
    EXPECT_TRUE(t.at("top_logprobs").at(0).at("bytes").is_array());
  }
}

TEST(HttpApi, ModelsAndTokenize) {
  server s;
  const reply m = s.get("/v1/models");
  ASSERT_EQ(m.status, 200u);
  EXPECT_EQ(m.json().at("object").as_string(), "list");
  const json::object& model = m.json().at("data").at(0).as_object();
  EXPECT_EQ(model.at("id").as_string(), s.eng->model_name());
  EXPECT_EQ(model.at("object").as_string(), "model");
  EXPECT_EQ(model.at("owned_by").as_string(), "anvil");
  EXPECT_EQ(model.at("max_model_len").as_int64(), 1024);

  const reply t = s.post("/tokenize", json::object{{"prompt", "Hello, world"}, {"add_special_tokens", false}});
  ASSERT_EQ(t.status, 200u) << t.body;
  const json::array& tokens = t.json().at("tokens").as_array();
  EXPECT_EQ(std::size_t(t.json().at("count").as_int64()), tokens.size());
  EXPECT_EQ(t.json().at("max_model_len").as_int64(), 1024);
  const reply d = s.post("/detokenize", json::object{{"tokens", tokens}});
  ASSERT_EQ(d.status, 200u) << d.body;
  EXPECT_EQ(d.json().at("prompt").as_string(), "Hello, world");
  expect_openai_error(s.post("/detokenize", json::object{{"tokens", json::array{1, 999999}}}), 400, "invalid_request_error");
}

const auto parse_metrics = anvil::testing::prometheus_samples;

TEST(HttpApi, MetricsMoveWithRequests) {
  server s;
  const reply before = s.get("/metrics");
  ASSERT_EQ(before.status, 200u);
  EXPECT_EQ(before.content_type.rfind("text/plain; version=0.0.4", 0), 0u);
  const auto m0 = parse_metrics(before.body);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(s.post("/v1/completions", greedy_completion(4)).status, 200u);
  // Three refusals made before submit (a range, a body that is no object, a token id): each counts as rejected.
  EXPECT_EQ(s.post("/v1/completions", json::object{{"prompt", "x"}, {"top_p", 5}}).status, 400u);
  EXPECT_EQ(s.post("/v1/completions", "{not json").status, 400u);
  const reply bad_id = s.post("/v1/completions", json::object{{"prompt", json::array{1, 999999}}});
  EXPECT_EQ(bad_id.status, 400u);
  EXPECT_NE(bad_id.body.find("token id 999999 (at index 1)"), std::string::npos) << bad_id.body;
  const reply after = s.get("/metrics");
  const auto m1 = parse_metrics(after.body);
  const std::string length = "anvil_requests_total{finish_reason=\"length\"}";
  EXPECT_EQ(m1.at(length) - m0.at(length), 3);
  EXPECT_EQ(m1.at("anvil_requests_rejected_total") - m0.at("anvil_requests_rejected_total"), 3);
  EXPECT_EQ(m1.at("anvil_requests_total{finish_reason=\"error\"}"), m0.at("anvil_requests_total{finish_reason=\"error\"}"));
  EXPECT_EQ(m1.at("anvil_generation_tokens_total") - m0.at("anvil_generation_tokens_total"), 12);
  EXPECT_GT(m1.at("anvil_prompt_tokens_total"), m0.at("anvil_prompt_tokens_total"));
  EXPECT_EQ(m1.at("anvil_healthy"), 1);
  EXPECT_GE(m1.at("anvil_kv_blocks_total"), 1);
  for (const char* h : {"anvil_time_to_first_token_seconds", "anvil_inter_token_latency_seconds",
                        "anvil_e2e_request_latency_seconds", "anvil_queue_time_seconds"}) {
    double last = 0;
    std::istringstream in(after.body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(std::string(h) + "_bucket{", 0) != 0) continue;
      const double v = std::stod(line.substr(line.rfind(' ') + 1));
      EXPECT_GE(v, last) << line;
      last = v;
    }
    EXPECT_EQ(m1.at(std::string(h) + "_count"), m1.at(std::string(h) + "_bucket{le=\"+Inf\"}")) << h;
    EXPECT_NE(after.body.find(std::string("# TYPE ") + h + " histogram"), std::string::npos) << h;
  }
  EXPECT_GE(m1.at("anvil_e2e_request_latency_seconds_count"), 3);
}

TEST(HttpApi, BadRequestsGetOpenAIErrorsAndTheServerCarriesOn) {
  server s;
  const auto bad = [&](std::string body, std::string target = "/v1/completions") {
    expect_openai_error(s.call("POST", target, std::move(body)), 400, "invalid_request_error");
  };
  bad("{not json");
  bad("[1, 2]");
  bad(R"({"prompt": 5})");
  bad(R"({"prompt": "x", "temperature": "hot"})");
  bad(R"({"prompt": "x", "top_p": 5})");
  bad(R"({"prompt": "x", "max_tokens": 0})");
  bad(R"({"prompt": "x", "logit_bias": {"100000": 1}})");
  bad(R"({"prompt": "x", "n": 99})");
  bad(R"({"messages": "hi"})", "/v1/chat/completions");
  bad(R"({"messages": [{"role": "user"}]})", "/v1/chat/completions");
  bad(R"({"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]})", "/v1/chat/completions");
  const reply long_prompt = s.post("/v1/completions", json::object{{"prompt", std::string(3000, 'a')}});
  expect_openai_error(long_prompt, 400, "invalid_request_error");
  EXPECT_NE(long_prompt.body.find("context"), std::string::npos) << long_prompt.body;
  const reply typed = s.call("POST", "/v1/completions", R"({"prompt": "x", "temperature": "hot"})");
  EXPECT_EQ(typed.json().at("error").at("param").as_string(), "temperature");

  expect_openai_error(s.get("/v2/nothing"), 404, "invalid_request_error");
  const reply wrong_method = s.get("/v1/completions");
  expect_openai_error(wrong_method, 405, "invalid_request_error");
  EXPECT_EQ(wrong_method.header("Allow"), "POST");

  // Too large a body (refused from its Content-Length), garbage, huge headers: answered, closed.
  const std::string big = s.raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 413 ", 0), 0u) << big;
  EXPECT_NE(big.find("\"error\""), std::string::npos);
  const std::string garbage = s.raw("THIS IS NOT HTTP\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400 ", 0), 0u) << garbage;
  const std::string binary = s.raw(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) + "\r\n\r\n");
  EXPECT_EQ(binary.rfind("HTTP/1.1 400 ", 0), 0u) << binary;
  const std::string headers = s.raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  EXPECT_EQ(headers.rfind("HTTP/1.1 431 ", 0), 0u) << headers;

  const reply ok = s.post("/v1/completions", greedy_completion(3));
  EXPECT_EQ(ok.status, 200u) << ok.body;
  EXPECT_EQ(s.get("/health").status, 200u);
  EXPECT_EQ(s.settled().kv.counts.in_use, 0);
}

TEST(HttpApi, ChatWithoutATemplateIsABadRequest) {
  engine_config cfg = tiny_config();
  cfg.model_path = [] {
    const auto& dir = anvil::testing::scratch_dir();
    model::synth_options opt;
    opt.shape = *model::find_synth_shape("tiny");
    opt.mix = model::synth_mix::f32;
    const std::string p = (dir / "tiny-plain.gguf").string();
    if (!std::filesystem::exists(p)) model::write_synth_model(opt, p);
    return p;
  }();
  server s(cfg);
  const reply r = s.post("/v1/chat/completions", json::object{{"messages", json::array{json::object{{"role", "user"}, {"content", "Hi"}}}}});
  expect_openai_error(r, 400, "invalid_request_error");
  EXPECT_NE(r.body.find("chat template"), std::string::npos) << r.body;
}

TEST(HttpApi, PipelinedRequestsAreAnsweredInOrderAndConnectionCloseIsHonoured) {
  server s;
  const std::string out = s.raw(
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");  // after the close: never answered
  const std::size_t a = out.find("HTTP/1.1 200 ");
  const std::size_t b = out.find("\"object\":\"list\"");
  const std::size_t c = out.find("HTTP/1.1 404 ");
  ASSERT_NE(a, std::string::npos) << out;
  ASSERT_NE(b, std::string::npos) << out;
  ASSERT_NE(c, std::string::npos) << out;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_EQ(out.find("HTTP/1.1", c + 1), std::string::npos) << out;
}

TEST(HttpApi, ApiKeyGuardsEverythingButHealth) {
  proto::http_server_options opt;
  opt.api_key = "sekrit";
  server s(tiny_config(), opt);
  expect_openai_error(s.post("/v1/completions", greedy_completion(2)), 401, "authentication_error");
  expect_openai_error(s.post("/v1/completions", greedy_completion(2), {{"Authorization", "Bearer wrong"}}), 401,
                      "authentication_error");
  expect_openai_error(s.get("/v1/models", {{"Authorization", "sekrit"}}), 401, "authentication_error");
  expect_openai_error(s.get("/metrics"), 401, "authentication_error");
  EXPECT_EQ(s.post("/v1/completions", greedy_completion(2), {{"Authorization", "Bearer sekrit"}}).status, 200u);
  EXPECT_EQ(s.get("/metrics", {{"Authorization", "Bearer sekrit"}}).status, 200u);
  EXPECT_EQ(s.get("/health").status, 200u);
}

TEST(HttpApi, AFullQueueAnswers429AndTheRestSucceed) {
  engine_config cfg = tiny_config();
  cfg.max_queue = 1;
  cfg.max_seqs = 1;
  server s(cfg);
  int rejected = 0, ok = 0;
  for (int round = 0; round < 5 && rejected == 0; ++round) {
    std::vector<std::thread> clients;
    std::atomic<int> n429{0}, n200{0}, other{0};
    for (int i = 0; i < 8; ++i) {
      clients.emplace_back([&, i] {
        json::object req = greedy_completion(64);
        req["stream"] = i % 2 == 0;
        const reply r = s.post("/v1/completions", req);
        if (r.status == 429) {
          ++n429;
          expect_openai_error(r, 429, "rate_limit_error");
        } else if (r.status == 200) {
          ++n200;
        } else {
          ++other;
          ADD_FAILURE() << r.status << " " << r.body;
        }
      });
    }
    for (auto& t : clients) t.join();
    rejected += n429;
    ok += n200;
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(ok, 0);
  EXPECT_EQ(s.settled().kv.counts.in_use, 0);
  // A 429 is a refusal, not a request that failed (HTTP.md, Metrics).
  const auto m = parse_metrics(s.get("/metrics").body);
  EXPECT_EQ(m.at("anvil_requests_rejected_total"), rejected);
  EXPECT_EQ(m.at("anvil_requests_total{finish_reason=\"error\"}"), 0);
}

// Sends `request` raw, reads until `until` shows up in the answer (or the server closes).
std::string send_and_read_until(tcp::socket& sock, const std::string& request, std::string_view until) {
  asio::write(sock, asio::buffer(request));
  std::string got;
  std::array<char, 4096> buf;
  boost::system::error_code ec;
  while (got.find(until) == std::string::npos) {
    const std::size_t n = sock.read_some(asio::buffer(buf), ec);
    if (ec) break;
    got.append(buf.data(), n);
  }
  return got;
}

std::string http_post(const std::string& target, const json::object& body) {
  const std::string b = json::serialize(body);
  return "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(b.size()) + "\r\n\r\n" + b;
}

TEST(HttpApi, ClientGoneMidStreamCancelsAndFreesTheKvBlocks) {
  server s;
  const std::uint64_t cancelled0 = s.eng->stats().requests.finished_cancelled;
  {
    asio::io_context cio;
    tcp::socket sock(cio);
    sock.connect({asio::ip::make_address("127.0.0.1"), s.port()});
    json::object req = greedy_completion(900);
    req["stream"] = true;
    req["n"] = 2;
    const std::string got = send_and_read_until(sock, http_post("/v1/completions", req), "\"text_completion\"");
    ASSERT_NE(got.find("text/event-stream"), std::string::npos) << got;
    EXPECT_GT(s.eng->stats().kv.counts.in_use, 0);
  }  // the socket closes here, the stream still running
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_EQ(st.requests.finished_cancelled - cancelled0, 2u);
  EXPECT_EQ(s.get("/health").status, 200u);
}

TEST(HttpApi, ClientGoneDuringANonStreamedRequestCancelsIt) {
  server s;
  const std::uint64_t cancelled0 = s.eng->stats().requests.finished_cancelled;
  {
    asio::io_context cio;
    tcp::socket sock(cio);
    sock.connect({asio::ip::make_address("127.0.0.1"), s.port()});
    asio::write(sock, asio::buffer(http_post("/v1/completions", greedy_completion(900))));
    engine_stats st = s.eng->stats();
    for (int i = 0; i < 6000 && st.kv.counts.in_use == 0; ++i) {  // running: it holds blocks
      std::this_thread::sleep_for(5ms);
      st = s.eng->stats();
    }
    ASSERT_GT(st.kv.counts.in_use, 0);
  }
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_EQ(st.requests.finished_cancelled - cancelled0, 1u);
  EXPECT_EQ(st.requests.finished_length, 0u);
}

TEST(HttpApi, IdleConnectionsAreClosed) {
  proto::http_server_options opt;
  opt.idle_timeout = std::chrono::seconds(1);
  server s(tiny_config(), opt);
  asio::io_context cio;
  tcp::socket sock(cio);
  sock.connect({asio::ip::make_address("127.0.0.1"), s.port()});
  asio::write(sock, asio::buffer(std::string("GET /hea")));  // a slow client that never finishes
  std::string got;
  boost::system::error_code ec;
  asio::read(sock, asio::dynamic_buffer(got), ec);  // returns once the server closes
  EXPECT_EQ(ec, asio::error::eof);
  for (int i = 0; i < 500 && s.srv->connections() != 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.srv->connections(), 0u);
}

}  // namespace
