// The HTTP server under a seeded stream of hostile requests — bad request lines, bad, duplicate
// and huge Content-Lengths, Content-Length with chunked, malformed chunked bodies, header floods
// and malformed header lines, odd methods, absolute-form and other odd targets, bad JSON bodies —
// each on its own connection and answered with its documented status (malformed HTTP: 400 and
// the connection closed; 413 and 431 likewise; 404 / 405 / 400 for bad JSON keep it open and the
// next request on it is answered), while a well-behaved client keeps getting the same correct
// answers on both servers. ANVIL_ABUSE_SEED picks the seed.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/proto/abuse_harness.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace json = boost::json;

constexpr std::size_t body_limit = 64 * 1024;  // the abuse server's max_body_bytes

struct abuse_request {
  std::string kind;
  std::string bytes;
  unsigned status;   // the documented answer
  bool closes;       // malformed HTTP, 413, 431: the connection is closed after the answer
};

class http_abuser {
 public:
  explicit http_abuser(std::uint64_t seed) : rng_(seed) {}

  abuse_request next() {
    switch (pick(8)) {
      case 0: return bad_request_line();
      case 1: return bad_content_length();
      case 2: return bad_chunked();
      case 3: return header_abuse();
      case 4: return odd_method();
      case 5: return odd_target();
      case 6: return bad_json_body();
      default: return body_too_large();
    }
  }

  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

 private:
  template <class T, std::size_t N>
  const T& one_of(const T (&a)[N]) {
    return a[pick(N)];
  }

  std::string random_bytes(std::size_t n, bool printable) {
    std::string s;
    for (std::size_t i = 0; i < n; ++i) {
      char c = printable ? char(33 + pick(94)) : char(pick(256));
      if (c == '\r' || c == '\n') c = 'x';
      s += c;
    }
    return s;
  }

  abuse_request bad_request_line() {
    static const char* lines[] = {
        "GET\r\n\r\n",
        "GET /health\r\n\r\n",
        "GET /health HTTP/1.1 extra\r\nHost: x\r\n\r\n",
        "GET  /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /health HTTP/1.x\r\nHost: x\r\n\r\n",
        "GET /health HTTP/11\r\nHost: x\r\n\r\n",
        "GET /hea lth HTTP/1.1\r\nHost: x\r\n\r\n",
        "/health GET HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /health HTTP/1.1\nHost: x\n\n",
        " GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /he\x01lth HTTP/1.1\r\nHost: x\r\n\r\n",
        "G\x80T /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    };
    if (pick(2)) return {"bad request line", one_of(lines), 400, true};
    // Random bytes, then the end of a header block.
    const bool printable = pick(2);
    std::string junk = random_bytes(1 + pick(200), printable);
    if (printable && junk.find(' ') == std::string::npos) junk.insert(junk.size() / 2, "\x01");
    return {"garbage", junk + "\r\n\r\n", 400, true};
  }

  std::string post_head(const std::vector<std::string>& headers) {
    std::string h = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    for (const std::string& x : headers) h += x + "\r\n";
    return h + "\r\n";
  }

  abuse_request bad_content_length() {
    static const char* values[] = {"abc", "-1", "1 2", "99999999999999999999999", "0x10", "+5", "5.0", "", "1,2", "٣"};
    const std::string body = R"({"prompt":[1],"max_tokens":1})";
    switch (pick(3)) {
      case 0: return {"bad Content-Length", post_head({"Content-Length: " + std::string(one_of(values))}) + body, 400, true};
      case 1: {
        const std::string a = std::to_string(body.size()), b = std::to_string(body.size() + 1 + pick(10));
        return {"two Content-Lengths", post_head({"Content-Length: " + a, "Content-Length: " + b}) + body, 400, true};
      }
      default:
        return {"Content-Length and chunked",
                post_head({"Content-Length: " + std::to_string(body.size()), "Transfer-Encoding: chunked"}) + body, 400, true};
    }
  }

  abuse_request bad_chunked() {
    const std::string head = post_head({"Transfer-Encoding: chunked"});
    static const char* bodies[] = {
        "zz\r\nhello\r\n0\r\n\r\n",
        "5\r\nhello0\r\n\r\n",                       // no CRLF after the data
        "ffffffffffffffffffff\r\nx\r\n0\r\n\r\n",    // a size past 64 bits
        "-5\r\nhello\r\n0\r\n\r\n",
        "5;\x01\r\nhello\r\n0\r\n\r\n",              // a control character in an extension
        "5 x\r\nhello\r\n0\r\n\r\n",
        "\r\n\r\n",
        "3\r\nabcdef\r\n0\r\n\r\n",                   // more data than the size says
    };
    if (pick(4) == 0) {  // chunks adding up past the body limit: 413
      std::string chunks;
      for (std::size_t sent = 0; sent <= body_limit; sent += 16384) chunks += "4000\r\n" + std::string(16384, ' ') + "\r\n";
      return {"chunked past the limit", head + chunks + "0\r\n\r\n", 413, true};
    }
    return {"bad chunked body", head + one_of(bodies), 400, true};
  }

  abuse_request header_abuse() {
    switch (pick(6)) {
      case 0: {  // a flood of small headers past 16 KiB
        std::string h = "GET /health HTTP/1.1\r\nHost: x\r\n";
        const std::size_t n = 2000 + pick(3000);
        for (std::size_t i = 0; i < n; ++i) h += "X-" + std::to_string(i) + ": v\r\n";
        return {"header flood", h + "\r\n", 431, true};
      }
      case 1: return {"huge header", "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(17000 + pick(50000), 'a') + "\r\n\r\n", 431, true};
      case 2: {  // many headers, but under the limit: fine
        std::string h = "GET /health HTTP/1.1\r\nHost: x\r\n";
        for (std::size_t i = 0, n = 50 + pick(400); i < n; ++i) h += "X-" + std::to_string(i) + ": v\r\n";
        return {"many headers", h + "\r\n", 200, false};
      }
      case 3: {  // obs-fold: RFC 9112 lets a server replace it with spaces (Beast does) or refuse it
        static const char* lines[] = {" folded: x", "X-Good: y\r\n continued", "X-Good: y\r\n\tcontinued"};
        return {"obs-fold", "GET /health HTTP/1.1\r\nHost: x\r\n" + std::string(one_of(lines)) + "\r\n\r\n", 200, false};
      }
      default: {
        static const char* lines[] = {"NoColon", "Bad Name: x", ": empty-name", "X-Nul: a\0b", "X-Ctl: a\x01b",
                                      "X-Bad\x7f: x", "X\x80: y"};
        std::string line = one_of(lines);
        if (line.rfind("X-Nul", 0) == 0) line = std::string("X-Nul: a\0b", 10);
        return {"malformed header", "GET /health HTTP/1.1\r\nHost: x\r\n" + line + "\r\n\r\n", 400, true};
      }
    }
  }

  abuse_request odd_method() {
    struct m {
      const char* method;
      const char* target;
      unsigned status;
    };
    static const m cases[] = {{"FOO", "/v1/models", 405},       {"get", "/health", 405},        {"DELETE", "/v1/completions", 405},
                              {"PUT", "/v1/chat/completions", 405}, {"BREW", "/nowhere", 404},  {"OPTIONS", "/v1/models", 405},
                              {"PATCH", "/tokenize", 405},       {"POST", "/health", 405},       {"CONNECT", "/metrics", 405}};
    const m& c = one_of(cases);
    return {std::string("method ") + c.method, http_request_bytes(c.method, c.target), c.status, false};
  }

  abuse_request odd_target() {
    struct t {
      const char* target;
      unsigned status;
    };
    static const t cases[] = {{"http://localhost/health", 200},        {"http://localhost:9/v1/models", 200},
                              {"HTTP://X/v1/models?x=1", 200},          {"https://example.com/health?a=b", 200},
                              {"http://localhost", 404},                {"*", 404},
                              {"health", 404},                          {"//health", 404},
                              {"/health/", 404},                        {"/v1/models/../models", 404},
                              {"/%68ealth", 404},                       {"/v1/models#frag", 404}};
    const t& c = one_of(cases);
    return {std::string("target ") + c.target, http_request_bytes("GET", c.target), c.status, false};
  }

  abuse_request bad_json_body() {
    static const char* targets[] = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"};
    static const char* bodies[] = {
        "{not json", "[1,2]", "null", "\"a string\"", "{\"prompt\":", "{\"prompt\":\"a\xff\"}", "{\"prompt\":\"\\ud800\"}",
        "{\"prompt\":1e999}", "{\"messages\":{}}", "{\"tokens\":\"1\"}", "{\"tokens\":[1.5]}", "{\"tokens\":[-1]}",
        "{\"prompt\":[1],\"n\":\"2\"}", "{\"prompt\":[1],\"stream_options\":5}", "{\"prompt\":[1],\"echo\":1}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":2}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", "{}",
    };
    std::string body = one_of(bodies);
    if (pick(3) == 0) {  // deep nesting
      const std::size_t d = 40 + pick(5000);
      body = "{\"prompt\":" + std::string(d, '[') + std::string(d, ']') + "}";
    } else if (pick(3) == 0) {
      body = random_bytes(1 + pick(300), false);
    } else if (pick(3) == 0) {
      body.insert(pick(body.size() + 1), std::string(1, '\0'));
    }
    return {"bad JSON body", http_request_bytes("POST", one_of(targets), body), 400, false};
  }

  abuse_request body_too_large() {
    return {"body too large",
            post_head({"Content-Length: " + std::to_string(body_limit + 1 + pick(1u << 20))}) + std::string(1000, ' '), 413, true};
  }

  std::mt19937_64 rng_;
};

TEST(HttpAbuse, SeededMalformedRequestsGetTheirStatusAndAWellBehavedClientIsUnaffected) {
  const std::uint64_t seed = abuse_seed();
  SCOPED_TRACE("ANVIL_ABUSE_SEED=" + std::to_string(seed));
  proto::http_server_options hopt;
  hopt.max_body_bytes = body_limit;
  hopt.idle_timeout = std::chrono::seconds(5);  // bounds a case that would leave the server waiting
  both_servers s(abuse_engine_config(), {}, hopt);
  steady_client good(s.line_port(), s.http_port());

  http_abuser gen(seed);
  std::map<std::string, int> by_kind;
  for (int i = 0; i < 400; ++i) {
    const abuse_request a = gen.next();
    ++by_kind[a.kind];
    const std::string shown = json::serialize(json::string(a.bytes.substr(0, 200)));
    line_client c(s.http_port());
    c.try_send(a.bytes);
    const auto r = read_http_reply(c, 30s);
    ASSERT_TRUE(r) << a.kind << ": no answer to " << shown;
    EXPECT_EQ(r->status, a.status) << a.kind << ": " << shown << " -> " << r->body;
    if (r->status >= 400) {
      const json::value v = r->json();
      EXPECT_TRUE(v.is_object() && v.as_object().contains("error")) << a.kind << ": " << r->body;
    }
    if (a.closes) {
      c.read_to_close(30s);
      EXPECT_TRUE(c.eof()) << a.kind << ": the connection stays open after " << shown;
    } else {  // the connection keeps working
      c.send(http_request_bytes("GET", "/health"));
      const auto next = read_http_reply(c, 30s);
      ASSERT_TRUE(next) << a.kind << ": no answer after " << shown;
      EXPECT_EQ(next->status, 200u) << a.kind << ": " << shown;
    }
  }
  // A valid request pipelined behind garbage is never reached; one before it is answered.
  {
    line_client c(s.http_port());
    c.send(http_request_bytes("GET", "/v1/models") + "GARBAGE\r\n\r\n" + http_request_bytes("GET", "/health"));
    const auto first = read_http_reply(c, 30s);
    ASSERT_TRUE(first);
    EXPECT_EQ(first->status, 200u);
    const auto second = read_http_reply(c, 30s);
    ASSERT_TRUE(second);
    EXPECT_EQ(second->status, 400u);
    EXPECT_EQ(c.read_to_close(30s), "");
    EXPECT_TRUE(c.eof());
  }
  expect_steady(good);
  for (const auto& [kind, n] : by_kind) std::printf("  %-28s %d\n", kind.c_str(), n);
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_EQ(st.live_requests, 0);
  EXPECT_TRUE(s.no_connections());
}

// The status and the error code of a refused request, and that the connection is closed after
// it with nothing more said: whatever followed the head is never run as a request.
struct refused {
  unsigned status = 0;
  std::string code;
  bool closed = false;
  std::string after;  // what came after the answer (must be nothing)
};

refused send_refused(std::uint16_t port, const std::string& bytes) {
  line_client c(port);
  c.try_send(bytes);
  refused out;
  const auto r = read_http_reply(c, 30s);
  if (!r) return out;
  out.status = r->status;
  out.code = r->error_code();
  out.after = c.read_to_close(30s);
  out.closed = c.eof();
  return out;
}

proto::http_server_options quick_timeouts() {
  proto::http_server_options o;
  o.idle_timeout = std::chrono::seconds(10);  // before the fixes these cases hung until it
  return o;
}

// RFC 9112 6.1: a request body is framed by a final "chunked" or by Content-Length, nothing else.
// Any other Transfer-Encoding is 400 and the connection closed, so the body (here a smuggled
// request) is never read as the next request.
TEST(HttpAbuse, TransferEncodingThatDoesNotEndInChunkedIs400AndCloses) {
  both_servers s(abuse_engine_config(), {}, quick_timeouts());
  const std::string smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  struct te_case {
    std::string headers;
    unsigned status;
  };
  const std::vector<te_case> cases = {
      {"Transfer-Encoding: gzip", 400},
      {"Transfer-Encoding: identity", 400},
      {"Transfer-Encoding: xchunked", 400},
      {"Transfer-Encoding: chunked, identity", 400},
      {"Transfer-Encoding: chunked, chunked", 400},
      {"Transfer-Encoding:", 400},
      {"Transfer-Encoding: gzip\r\nTransfer-Encoding: identity", 400},
      {"Transfer-Encoding: gzip, chunked", 501},  // framed, but a coding anvil does not decode
      {"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked", 501},
  };
  for (const te_case& k : cases) {
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + k.headers + "\r\n\r\n";
    const refused r = send_refused(s.http_port(), head + smuggled);
    EXPECT_EQ(r.status, k.status) << k.headers;
    EXPECT_EQ(r.code, k.status == 400 ? "bad_request" : "not_implemented") << k.headers;
    EXPECT_TRUE(r.closed) << k.headers;
    EXPECT_EQ(r.after, "") << k.headers;
  }
  // HTTP/1.0 has no Transfer-Encoding (RFC 9112 6.1).
  const refused old = send_refused(s.http_port(), "POST /tokenize HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  EXPECT_EQ(old.status, 400u);
  EXPECT_TRUE(old.closed);
  // Plain chunked still works, and so does a body split into many tiny chunks in one write.
  std::string body = R"({"prompt":")" + std::string(6000, 'a') + R"("})", chunks;
  for (char ch : body) chunks += std::string("1;ext=v\r\n") + ch + "\r\n";
  const auto ok = http_exchange(s.http_port(), "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks +
                                                   "0\r\nX-Trailer: t\r\n\r\n");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200u) << ok->body.substr(0, 300);
  EXPECT_TRUE(s.no_connections());
}

// A chunk header or a trailer section that never ends is bounded like the headers (16 KiB):
// 400 for a chunk header (endless extensions or size digits), 431 for trailers, then closed —
// instead of being buffered without bound until the idle timeout.
TEST(HttpAbuse, EndlessChunkExtensionsAndTrailersAreRefused) {
  both_servers s(abuse_engine_config(), {}, quick_timeouts());
  const std::string head = "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string endless(1u << 20, 'a');
  struct chunk_case {
    std::string what, bytes, code;
    unsigned status;
  };
  const std::vector<chunk_case> cases = {
      {"extension", head + "1;" + endless, "bad_request", 400},
      {"extension after a chunk", head + "1\r\n{\r\n2;x=" + endless, "bad_request", 400},
      {"size digits", head + std::string(1u << 20, '0'), "bad_request", 400},
      {"last chunk extension", head + "0;" + endless, "bad_request", 400},
      {"trailer", head + "1\r\n{\r\n0\r\nX-T: " + endless, "headers_too_large", 431},
      {"many trailers", head + "0\r\n" + [] {
         std::string t;
         for (int i = 0; i < 40000; ++i) t += "X-" + std::to_string(i) + ": v\r\n";
         return t;
       }(), "headers_too_large", 431},
  };
  for (const chunk_case& k : cases) {
    const refused r = send_refused(s.http_port(), k.bytes);
    EXPECT_EQ(r.status, k.status) << k.what;
    EXPECT_EQ(r.code, k.code) << k.what;
    EXPECT_TRUE(r.closed) << k.what;
  }
  EXPECT_TRUE(s.no_connections());
}

// RFC 9112 3.2: an HTTP/1.1 request has exactly one Host. RFC 9110 10.1.1: an expectation the
// server does not understand is 417 (only 100-continue is).
TEST(HttpAbuse, MissingHostIs400AndUnknownExpectationIs417) {
  both_servers s(abuse_engine_config(), {}, quick_timeouts());
  const refused no_host = send_refused(s.http_port(), "GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(no_host.status, 400u);
  EXPECT_EQ(no_host.code, "bad_request");
  EXPECT_TRUE(no_host.closed);
  const refused two_hosts = send_refused(s.http_port(), "GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
  EXPECT_EQ(two_hosts.status, 400u);
  EXPECT_TRUE(two_hosts.closed);
  // HTTP/1.0 needs none.
  const auto old = http_exchange(s.http_port(), "GET /health HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->status, 200u);

  for (const std::string expect : {"999-foo", "100-continue, 999-foo", "100-continuex"}) {
    const refused r = send_refused(s.http_port(), http_request_bytes("POST", "/tokenize", R"({"prompt":"a"})", {"Expect: " + expect}));
    EXPECT_EQ(r.status, 417u) << expect;
    EXPECT_EQ(r.code, "expectation_failed") << expect;
    EXPECT_TRUE(r.closed) << expect;
    EXPECT_EQ(r.after, "") << expect;
  }
  const auto cont = http_exchange(s.http_port(), http_request_bytes("POST", "/tokenize", R"({"prompt":"a"})", {"Expect: 100-Continue"}));
  ASSERT_TRUE(cont);
  EXPECT_EQ(cont->status, 200u);
}

}  // namespace
