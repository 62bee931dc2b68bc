// http_session without a socket: requests in, responses out through recording hooks. Covers the
// routing, auth and "loading" answers that need no engine (the engine paths run over loopback in
// http_test.cpp).
#include <functional>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "proto/http_session.h"

namespace {

using namespace anvil;
namespace json = boost::json;

struct recorder {
  std::vector<proto::http_response> responses;
  std::vector<std::function<void()>> posted;

  proto::http_session_hooks hooks() {
    proto::http_session_hooks h;
    h.respond = [this](proto::http_response r) { responses.push_back(std::move(r)); };
    h.start_stream = [] { ADD_FAILURE() << "no stream expected"; };
    h.stream = [](std::string) { ADD_FAILURE() << "no stream expected"; };
    h.end_stream = [](bool) { ADD_FAILURE() << "no stream expected"; };
    h.post = [this](std::function<void()> fn) { posted.push_back(std::move(fn)); };
    return h;
  }
};

std::string error_code_of(const proto::http_response& r) {
  return std::string(json::parse(r.body).at("error").at("code").as_string());
}

TEST(HttpSession, RoutesWithoutAnEngine) {
  recorder rec;
  auto s = std::make_shared<proto::http_session>(rec.hooks(), "");
  s->handle({"GET", "/health", "", ""}, nullptr);
  s->handle({"GET", "/health?verbose=1", "", ""}, nullptr);
  s->handle({"POST", "/v1/completions", "", "{}"}, nullptr);
  s->handle({"GET", "/v1/completions", "", ""}, nullptr);
  s->handle({"GET", "/nowhere", "", ""}, nullptr);
  s->handle({"POST", "/health", "", ""}, nullptr);
  ASSERT_EQ(rec.responses.size(), 6u);
  EXPECT_EQ(rec.responses[0].status, 503u);
  EXPECT_EQ(json::parse(rec.responses[0].body).at("status").as_string(), "loading");
  EXPECT_EQ(rec.responses[1].status, 503u);
  EXPECT_EQ(rec.responses[2].status, 503u);
  EXPECT_EQ(error_code_of(rec.responses[2]), "loading");
  EXPECT_EQ(rec.responses[3].status, 405u);
  EXPECT_EQ(rec.responses[3].allow, "POST");
  EXPECT_EQ(rec.responses[4].status, 404u);
  EXPECT_EQ(rec.responses[5].status, 405u);
  EXPECT_FALSE(s->busy());
  EXPECT_TRUE(rec.posted.empty());
}

TEST(HttpSession, ApiKeyIsCheckedBeforeRoutingButNotForHealth) {
  recorder rec;
  auto s = std::make_shared<proto::http_session>(rec.hooks(), "k3y");
  s->handle({"GET", "/v1/models", "", ""}, nullptr);
  s->handle({"GET", "/nowhere", "Bearer nope", ""}, nullptr);
  s->handle({"GET", "/v1/models", "k3y", ""}, nullptr);
  s->handle({"GET", "/v1/models", "Bearer k3y", ""}, nullptr);  // passes auth; no engine yet
  s->handle({"GET", "/health", "", ""}, nullptr);
  ASSERT_EQ(rec.responses.size(), 5u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rec.responses[std::size_t(i)].status, 401u) << i;
    EXPECT_EQ(json::parse(rec.responses[std::size_t(i)].body).at("error").at("type").as_string(), "authentication_error");
  }
  EXPECT_EQ(rec.responses[3].status, 503u);
  EXPECT_EQ(rec.responses[4].status, 503u);
}

TEST(HttpSession, NothingIsSentAfterTheClientIsGone) {
  recorder rec;
  auto s = std::make_shared<proto::http_session>(rec.hooks(), "");
  s->on_close();
  s->handle({"GET", "/health", "", ""}, nullptr);
  EXPECT_TRUE(rec.responses.empty());
}

}  // namespace
