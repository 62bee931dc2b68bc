#include "tests/proto/http_loopback.h"

#include <chrono>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace anvil::http_loopback {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

bool header_less::operator()(const std::string& a, const std::string& b) const {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) < std::tolower(static_cast<unsigned char>(y));
  });
}

struct server::io {
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> work{ctx.get_executor()};
  std::vector<std::thread> threads;
};

server::server(std::optional<engine_config> cfg, proto::http_server_options opt) : io_(std::make_unique<io>()) {
  srv = std::make_unique<proto::http_server>(io_->ctx, std::move(opt));
  if (cfg) {
    eng = engine::create(*cfg);
    srv->set_engine(eng);
  }
  for (int i = 0; i < 2; ++i) io_->threads.emplace_back([this] { io_->ctx.run(); });
}

server::~server() {
  srv->stop();
  if (eng) eng->async_stop(asio::use_future).get();
  io_->work.reset();
  io_->ctx.stop();
  for (auto& t : io_->threads) t.join();
  srv.reset();
}

std::uint16_t server::port() const { return srv->port(); }

reply server::call(std::string method, std::string target, std::string body,
                   std::vector<std::pair<std::string, std::string>> hdrs) {
  asio::io_context cio;
  tcp::socket sock(cio);
  sock.connect({asio::ip::make_address("127.0.0.1"), port()});
  http::request<http::string_body> req;
  req.method_string(method);
  req.target(target);
  req.version(11);
  req.set(http::field::host, "localhost");
  for (auto& [k, v] : hdrs) req.set(k, v);
  if (!body.empty() || method == "POST") {
    req.set(http::field::content_type, "application/json");
    req.body() = std::move(body);
    req.prepare_payload();
  }
  http::write(sock, req);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  http::read(sock, buf, parser);
  auto& res = parser.get();
  reply r{.status = res.result_int(), .content_type = std::string(res[http::field::content_type]), .body = res.body(),
          .headers = {}, .parsed = {}};
  for (const auto& f : res.base()) r.headers[std::string(f.name_string())] = std::string(f.value());
  return r;
}

std::string server::raw(const std::string& bytes) {
  asio::io_context cio;
  tcp::socket sock(cio);
  sock.connect({asio::ip::make_address("127.0.0.1"), port()});
  asio::write(sock, asio::buffer(bytes));
  std::string out;
  boost::system::error_code ec;
  asio::read(sock, asio::dynamic_buffer(out), ec);
  return out;
}

engine_stats server::settled() {
  engine_stats s = eng->stats();
  for (int i = 0; i < 6000 && (s.kv.counts.in_use != 0 || s.sched.running + s.sched.waiting != 0 || s.live_requests != 0); ++i) {
    std::this_thread::sleep_for(10ms);
    s = eng->stats();
  }
  return s;
}

}  // namespace anvil::http_loopback
