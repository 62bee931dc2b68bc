// The line-protocol client (proto/PROTOCOL.md): requests spread over a few TCP connections and
// multiplexed on each by integer id. A connection connects when first needed, sends {"auth": KEY}
// and waits for {"auth":"ok"} when there is a key, then writes queued request lines in order. Each
// read is timestamped as it completes and split into lines; the lines of a request are chunks
// (TTFT, ITL) and then a done line (usage) or an error line.
//
// Failures are results: a refused connection or a closed one fails the requests it carried, an
// error line fails its request, a timeout fails the request and sends {"cancel": id}.
#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio.hpp>
#include <boost/json.hpp>

#include "bench/load/client.h"
#include "bench/load/stream_parse.h"
#include "bench/load/wire.h"

namespace anvil::bench {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using steady = std::chrono::steady_clock;

class line_client;

// One TCP connection and the ids in flight on it.
class line_connection : public std::enable_shared_from_this<line_connection> {
 public:
  enum class state { idle, connecting, authenticating, ready };

  line_connection(asio::io_context& io, line_client& owner) : io_(io), socket_(io), owner_(owner) {}

  // Queues a line; connects first when idle.
  void write(std::string line);
  // Queues a line only on a live connection (a cancel is pointless on a new one).
  void write_if_ready(std::string line) {
    if (state_ == state::ready) write(std::move(line));
  }
  void close();

  std::unordered_set<std::int64_t> ids;  // requests in flight on this connection

 private:
  void connect();
  void start_session();
  void read();
  void flush();
  void lost(const std::string& why);

  asio::io_context& io_;                 // the run's io_context
  tcp::socket socket_;                   // the connection
  line_client& owner_;                   // gets every line and the loss of the connection
  state state_ = state::idle;            // where the connection stands
  std::deque<std::string> outbox_;       // request lines waiting to be written (in order)
  bool writing_ = false;                 // an async_write is in progress
  std::array<char, 65536> read_buf_{};   // one read's bytes
  line_splitter lines_;                  // bytes -> lines
  std::string last_error_;               // an error line without an id (e.g. unauthorized)
  std::uint64_t generation_ = 0;         // bumped on every (re)connect; stale handlers see a change
};

// One request waiting for its answer.
struct line_request_state {
  bench_client::done_fn done;                      // called once with the result
  steady::time_point sent;                         // when its line was queued
  std::optional<steady::time_point> last_chunk;    // arrival of the previous chunk with content
  request_result result;                           // filled as lines arrive
  std::int64_t counted_tokens = 0;                 // tokens seen in chunks (fallback for usage)
  std::unique_ptr<asio::steady_timer> timer;       // the per-request timeout
  std::shared_ptr<line_connection> conn;           // where it was sent
};

class line_client final : public bench_client {
 public:
  line_client(asio::io_context& io, const client_config& config) : io_(io), config_(config) {
    for (int i = 0; i < std::max(1, config.connections); ++i) conns_.push_back(std::make_shared<line_connection>(io, *this));
  }

  ~line_client() override {
    for (auto& c : conns_) c->close();
  }

  void send(const bench_prompt& prompt, int max_tokens, done_fn done) override {
    if (stopped_) {
      request_result r;
      r.error = stop_reason_;
      r.prompt_tokens = prompt.estimated_input_len;
      asio::post(io_, [done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
      return;
    }
    const std::int64_t id = next_id_++;
    auto conn = *std::min_element(conns_.begin(), conns_.end(),
                                  [](const auto& a, const auto& b) { return a->ids.size() < b->ids.size(); });
    auto& st = requests_[id];
    st.done = std::move(done);
    st.sent = steady::now();
    st.result.prompt_tokens = prompt.estimated_input_len;
    st.conn = conn;
    st.timer = std::make_unique<asio::steady_timer>(io_);
    st.timer->expires_after(std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(config_.timeout_s)));
    st.timer->async_wait([this, id](boost::system::error_code ec) {
      if (ec) return;
      auto it = requests_.find(id);
      if (it == requests_.end()) return;
      auto on = it->second.conn;
      fail(id, "timeout: no answer within " + format_seconds(config_.timeout_s));
      on->write_if_ready(boost::json::serialize(boost::json::object{{"cancel", id}}) + "\n");
    });
    conn->ids.insert(id);
    conn->write(line_request(id, prompt, max_tokens));
  }

  void shutdown(const std::string& why) override {
    stopped_ = true;
    stop_reason_ = why;
    std::vector<std::int64_t> ids;
    for (const auto& [id, st] : requests_) ids.push_back(id);
    for (auto id : ids) fail(id, why);
    for (auto& c : conns_) c->close();
  }

  const client_config& config() const { return config_; }

  // A line arrived at `now` on `conn`.
  void on_line(line_connection& conn, const std::string& line, steady::time_point now, std::string& conn_error) {
    const line_answer a = parse_line_answer(line);
    auto it = a.id ? requests_.find(*a.id) : requests_.end();
    if (it == requests_.end() || it->second.conn.get() != &conn) {
      // Not ours (any more): a cancelled request's last lines, or an error naming no request.
      if (a.type == line_answer::kind::error && !a.id) conn_error = a.error;
      return;
    }
    auto& st = it->second;
    switch (a.type) {
      case line_answer::kind::chunk:
        if (!a.has_content) return;
        if (!st.last_chunk) {
          st.result.ttft_s = seconds(now - st.sent);
        } else {
          st.result.itls_s.push_back(seconds(now - *st.last_chunk));
        }
        st.last_chunk = now;
        st.counted_tokens += a.n_tokens > 0 ? a.n_tokens : 1;
        return;
      case line_answer::kind::done: {
        if (a.finish_reason == "cancelled") return fail(*a.id, "cancelled by the server");
        st.counted_tokens += a.n_tokens;
        request_result r = std::move(st.result);
        r.ok = true;
        r.e2el_s = seconds(now - st.sent);
        if (!st.last_chunk) r.ttft_s = r.e2el_s;
        r.output_tokens = a.completion_tokens.value_or(st.counted_tokens);
        if (a.prompt_tokens) r.prompt_tokens = *a.prompt_tokens;
        return finish(*a.id, std::move(r));
      }
      case line_answer::kind::error:
      case line_answer::kind::unknown:
        return fail(*a.id, a.error);
      case line_answer::kind::auth_ok:
        return;
    }
  }

  // The connection is gone: everything it carried fails with `why`.
  void on_lost(line_connection& conn, const std::string& why) {
    const std::vector<std::int64_t> ids(conn.ids.begin(), conn.ids.end());
    for (auto id : ids) fail(id, why);
  }

 private:
  static double seconds(steady::duration d) { return std::chrono::duration<double>(d).count(); }

  void fail(std::int64_t id, const std::string& why) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    request_result r = std::move(it->second.result);
    r.ok = false;
    r.error = why.empty() ? "failed" : why;
    finish(id, std::move(r));
  }

  void finish(std::int64_t id, request_result r) {
    auto node = requests_.extract(id);
    auto& st = node.mapped();
    st.timer->cancel();
    st.conn->ids.erase(id);
    asio::post(io_, [done = std::move(st.done), r = std::move(r)]() mutable { done(std::move(r)); });
  }

  asio::io_context& io_;                                           // the run's io_context
  client_config config_;                                           // target, key, timeout
  std::vector<std::shared_ptr<line_connection>> conns_;            // the connections
  std::unordered_map<std::int64_t, line_request_state> requests_;  // in flight, by id
  std::int64_t next_id_ = 1;                                       // ids are never reused
  bool stopped_ = false;                                           // shutdown() was called
  std::string stop_reason_;                                        // what later sends fail with
};

void line_connection::write(std::string line) {
  outbox_.push_back(std::move(line));
  if (state_ == state::idle) return connect();
  flush();
}

void line_connection::connect() {
  state_ = state::connecting;
  last_error_.clear();
  lines_ = line_splitter{};
  const auto gen = ++generation_;
  auto resolver = std::make_shared<tcp::resolver>(io_);
  const auto& t = owner_.config().target;
  resolver->async_resolve(t.host, std::to_string(t.port), [this, self = shared_from_this(), resolver, gen](
                                                               boost::system::error_code ec, tcp::resolver::results_type eps) {
    if (gen != generation_) return;
    if (ec) return lost("cannot resolve " + owner_.config().target.host + ": " + ec.message());
    asio::async_connect(socket_, eps, [this, self, gen](boost::system::error_code ec2, const tcp::endpoint&) {
      if (gen != generation_) return;
      if (ec2) return lost("connect: " + ec2.message());
      socket_.set_option(tcp::no_delay(true));
      start_session();
    });
  });
}

void line_connection::start_session() {
  read();
  if (owner_.config().api_key.empty()) {
    state_ = state::ready;
    return flush();
  }
  state_ = state::authenticating;
  auto auth = std::make_shared<std::string>(line_auth(owner_.config().api_key));
  writing_ = true;
  asio::async_write(socket_, asio::buffer(*auth), [this, self = shared_from_this(), auth, gen = generation_](
                                                      boost::system::error_code ec, std::size_t) {
    if (gen != generation_) return;
    writing_ = false;
    if (ec) return lost("write: " + ec.message());
    flush();
  });
}

void line_connection::flush() {
  if (state_ != state::ready || writing_ || outbox_.empty()) return;
  writing_ = true;
  auto batch = std::make_shared<std::string>();
  while (!outbox_.empty()) {
    *batch += outbox_.front();
    outbox_.pop_front();
  }
  asio::async_write(socket_, asio::buffer(*batch), [this, self = shared_from_this(), batch, gen = generation_](
                                                       boost::system::error_code ec, std::size_t) {
    if (gen != generation_) return;
    writing_ = false;
    if (ec) return lost("write: " + ec.message());
    flush();
  });
}

void line_connection::read() {
  socket_.async_read_some(asio::buffer(read_buf_), [this, self = shared_from_this(), gen = generation_](
                                                       boost::system::error_code ec, std::size_t n) {
    if (gen != generation_) return;
    const auto now = steady::now();
    if (ec) {
      std::string why = ec == asio::error::eof ? "connection closed by the server" : "read: " + ec.message();
      if (!last_error_.empty()) why += " (" + last_error_ + ")";
      return lost(why);
    }
    for (const auto& line : lines_.feed(std::string_view(read_buf_.data(), n))) {
      if (line.empty()) continue;
      if (state_ == state::authenticating && parse_line_answer(line).type == line_answer::kind::auth_ok) {
        state_ = state::ready;
        flush();
        continue;
      }
      owner_.on_line(*this, line, now, last_error_);
      if (gen != generation_) return;  // the line closed the connection
    }
    read();
  });
}

void line_connection::lost(const std::string& why) {
  ++generation_;
  boost::system::error_code ignored;
  socket_.close(ignored);
  state_ = state::idle;
  writing_ = false;
  outbox_.clear();
  owner_.on_lost(*this, why);
}

void line_connection::close() {
  ++generation_;
  boost::system::error_code ignored;
  socket_.close(ignored);
  state_ = state::idle;
  writing_ = false;
  outbox_.clear();
}

}  // namespace

std::unique_ptr<bench_client> make_line_client(asio::io_context& io, const client_config& config) {
  return std::make_unique<line_client>(io, config);
}

}  // namespace anvil::bench
