// What the abuse, disconnect and auth tests share: both servers in process on one engine (a tiny
// random-weight model with a ChatML template), and a well-behaved client that keeps asking both servers the same greedy question in the
// background and checks every answer against the first (the "others are unaffected" half of
// every abuse test).
#pragma once

#include <cstdlib>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/arch/synth.h"
#include "proto/http_server.h"
#include "proto/line_server.h"
#include "tests/proto/line_client.h"
#include "tests/proto/raw_http.h"
#include "tests/model/fixtures.h"

namespace anvil::testing {

// The seed of the hostile-input generators: ANVIL_ABUSE_SEED, else a fixed one.
inline std::uint64_t abuse_seed() {
  const char* s = std::getenv("ANVIL_ABUSE_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20240607;
}

using namespace std::chrono_literals;


inline engine_config abuse_engine_config() {
  engine_config c;
  c.model_path = model::testing::chatml_fixture();
  c.kv_budget_bytes = 8u << 20;
  c.max_batch_tokens = 256;
  c.max_seqs = 16;
  c.max_prefill_chunk = 64;
  c.max_model_len = 512;
  return c;
}

// The line server and the HTTP server on one engine, on two io threads.
struct both_servers {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::shared_ptr<engine> eng;
  std::unique_ptr<proto::line_server> line;
  std::unique_ptr<proto::http_server> http;
  std::vector<std::thread> threads;

  explicit both_servers(engine_config cfg = abuse_engine_config(), proto::line_server_options lopt = {},
                        proto::http_server_options hopt = {}) {
    eng = engine::create(cfg);
    line = std::make_unique<proto::line_server>(io, eng, lopt);
    http = std::make_unique<proto::http_server>(io, hopt);
    http->set_engine(eng);
    http->add_connection_gauge("line", [l = line.get()] { return l->connections(); });
    for (int i = 0; i < 2; ++i) threads.emplace_back([this] { io.run(); });
  }
  ~both_servers() {
    line->stop();
    http->stop();
    eng->async_stop(boost::asio::use_future).get();
    work.reset();
    io.stop();
    for (auto& t : threads) t.join();
  }
  std::uint16_t line_port() const { return line->port(); }
  std::uint16_t http_port() const { return http->port(); }

  // Stats once no request is live, none is queued or running and no KV block is in use (or what
  // they are after a minute).
  engine_stats settled() {
    engine_stats s = eng->stats();
    for (int i = 0; i < 6000 && (s.kv.counts.in_use != 0 || s.live_requests != 0 || s.sched.running + s.sched.waiting != 0); ++i) {
      std::this_thread::sleep_for(10ms);
      s = eng->stats();
    }
    return s;
  }
  // True once both servers hold no connection (within 20 s).
  bool no_connections() {
    for (int i = 0; i < 2000; ++i) {
      if (line->connections() == 0 && http->connections() == 0) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  // Polls until pred holds; false after 5 minutes (a bound that only turns a hang into a failure:
  // under TSan a tiny model's streams of hundreds of tokens take over a minute).
  template <class Pred>
  bool wait_stats(Pred pred) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred(eng->stats())) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

// Asks both servers the same greedy question over and over until stopped: every answer must be
// whole and equal to the first one of its protocol. failures() says what went wrong, if anything.
class steady_client {
 public:
  steady_client(std::uint16_t line_port, std::uint16_t http_port) {
    thread_ = std::thread([this, line_port, http_port] { run(line_port, http_port); });
  }
  ~steady_client() { stop(); }
  // Stops after the exchange in progress; returns the number of correct answers.
  int stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return ok_;
  }
  std::vector<std::string> failures() {
    std::lock_guard lock(mu_);
    return failures_;
  }
  int ok() const { return ok_; }

 private:
  void fail(std::string what) {
    std::lock_guard lock(mu_);
    if (failures_.size() < 20) failures_.push_back(std::move(what));
  }

  // One request on the connection `c`, kept from the request before. The server may have closed
  // it meanwhile for being idle past its limit (a loaded machine stretches the time between
  // requests): then a new one is opened first, as a real client does. A connection closed while
  // a request is on it is still a failure.
  template <class Exchange>
  std::string on_connection(std::unique_ptr<line_client>& c, std::uint16_t port, Exchange exchange) {
    if (c && c->closed_by_server(0ms)) c.reset();
    if (!c) c = std::make_unique<line_client>(port);
    return exchange(*c);
  }

  void run(std::uint16_t line_port, std::uint16_t http_port) {
    namespace json = boost::json;
    const std::string body = R"({"prompt":[5,6,7],"max_tokens":4,"ignore_eos":true,"temperature":0})";
    std::optional<std::string> line_text, http_text;
    std::unique_ptr<line_client> tcp, web;
    for (int i = 0; !stop_; ++i) {
      try {
        const json::object o = json::parse(on_connection(tcp, line_port, [&](line_client& c) {
                                 c.send_line(R"({"id":)" + std::to_string(i) +
                                             R"(,"prompt":[5,6,7],"max_tokens":4,"ignore_eos":true,"stream":false})");
                                 return json::serialize(c.read_json(60s));
                               })).as_object();
        if (o.at("id") != i || o.at("finish_reason") != "length" || o.at("usage").at("completion_tokens") != 4) {
          fail("line: " + json::serialize(o));
        } else if (const std::string t(o.at("text").as_string()); line_text && t != *line_text) {
          fail("line: a different text: " + t);
        } else {
          line_text = t;
          ++ok_;
        }
        unsigned status = 0;
        const std::string answer = on_connection(web, http_port, [&](line_client& c) {  // keep-alive
          c.send(http_request_bytes("POST", "/v1/completions", body));
          const auto r = read_http_reply(c, 60s);
          status = r ? r->status : 0;
          return r ? r->body : std::string();
        });
        if (status != 200) {
          fail("http: " + (status ? std::to_string(status) + " " + answer : std::string("no answer")));
          web.reset();
          continue;
        }
        const json::value v = json::parse(answer);
        const std::string t(v.at("choices").at(0).at("text").as_string());
        if (v.at("usage").at("completion_tokens") != 4 || (http_text && t != *http_text)) {
          fail("http: " + answer);
        } else {
          http_text = t;
          ++ok_;
        }
      } catch (const std::exception& e) {
        fail(std::string("exception: ") + e.what());
        tcp.reset();
        web.reset();
      }
    }
  }

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0};
  std::mutex mu_;
  std::vector<std::string> failures_;
};

// Stops `c` and expects it answered correctly throughout (and at least `min_ok` times).
inline void expect_steady(steady_client& c, int min_ok = 4) {
  for (int i = 0; i < 6000 && c.ok() < min_ok && c.failures().empty(); ++i) std::this_thread::sleep_for(10ms);
  const int ok = c.stop();
  for (const std::string& f : c.failures()) ADD_FAILURE() << "the well-behaved client: " << f;
  EXPECT_GE(ok, min_ok) << "the well-behaved client got too few answers";
}

}  // namespace anvil::testing
