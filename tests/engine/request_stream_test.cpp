// request_stream: stop strings across token boundaries, held-back prefixes, UTF-8 safety.
#include "engine/request_stream.h"

#include <gtest/gtest.h>

#include "model/arch/synth.h"

namespace {

using anvil::request_stream;

const anvil::model::tokenizer& byte_tokenizer() {
  static const anvil::model::tokenizer t(anvil::model::synthetic_tokenizer(300));
  return t;
}

// Feeds the bytes of `text` one token per byte; returns what was shown, piece by piece.
std::vector<std::string> feed(request_stream& s, std::string_view text, bool* stopped = nullptr) {
  std::vector<std::string> shown;
  for (unsigned char c : text) {
    auto p = s.push(static_cast<std::int32_t>(c), request_stream::clock::now());
    shown.push_back(p.text);
    if (p.stopped && stopped) *stopped = true;
  }
  return shown;
}

TEST(RequestStream, PassesTextThroughWithoutStopStrings) {
  request_stream s(byte_tokenizer(), {}, request_stream::clock::now());
  feed(s, "hello world");
  s.flush(request_stream::clock::now());
  EXPECT_EQ(s.text(), "hello world");
  EXPECT_EQ(s.completion_tokens(), 11);
}

TEST(RequestStream, CutsBeforeAStopStringSpanningTokens) {
  request_stream s(byte_tokenizer(), {"END"}, request_stream::clock::now());
  bool stopped = false;
  const auto shown = feed(s, "abcENDxyz", &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(s.text(), "abc");
  EXPECT_EQ(shown[3], "");  // "E" is held back: it could start "END"
  EXPECT_EQ(s.flush(request_stream::clock::now()), "");
}

TEST(RequestStream, ReleasesAHeldPrefixOnceItDiverges) {
  request_stream s(byte_tokenizer(), {"END"}, request_stream::clock::now());
  const auto shown = feed(s, "xENx");
  EXPECT_EQ(shown[1], "");
  EXPECT_EQ(shown[2], "");
  EXPECT_EQ(shown[3], "ENx");
  EXPECT_EQ(s.text(), "xENx");
}

TEST(RequestStream, ShowsAHeldPrefixAtTheEnd) {
  request_stream s(byte_tokenizer(), {"END"}, request_stream::clock::now());
  feed(s, "abEN");
  EXPECT_EQ(s.text(), "ab");
  EXPECT_EQ(s.flush(request_stream::clock::now()), "EN");
  EXPECT_EQ(s.text(), "abEN");
}

TEST(RequestStream, NeverSplitsAUtf8Character) {
  request_stream s(byte_tokenizer(), {}, request_stream::clock::now());
  const auto shown = feed(s, "\xf0\x9f\x98\x80!");  // an emoji, one byte token at a time, then "!"
  EXPECT_EQ(shown[0], "");
  EXPECT_EQ(shown[2], "");
  EXPECT_EQ(shown[3], "\xf0\x9f\x98\x80");
  EXPECT_EQ(shown[4], "!");
}

TEST(RequestStream, TheEarliestOfSeveralStopStringsWins) {
  request_stream s(byte_tokenizer(), {"zz", "b"}, request_stream::clock::now());
  bool stopped = false;
  feed(s, "abzz", &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(s.text(), "a");
}

TEST(RequestStream, ReportsTimings) {
  const auto t0 = request_stream::clock::now();
  request_stream s(byte_tokenizer(), {}, t0);
  s.mark_first_step(t0 + std::chrono::milliseconds(5));
  s.push('a', t0 + std::chrono::milliseconds(10));
  s.push('b', t0 + std::chrono::milliseconds(14));
  s.push('c', t0 + std::chrono::milliseconds(18));
  s.flush(t0 + std::chrono::milliseconds(20));
  const auto t = s.timings();
  EXPECT_NEAR(t.queue_ms, 5, 1e-6);
  EXPECT_NEAR(t.ttft_ms, 10, 1e-6);
  EXPECT_NEAR(t.total_ms, 20, 1e-6);
  EXPECT_NEAR(t.mean_itl_ms, 4, 1e-6);
}

}  // namespace
