// Lines and server-sent events from bytes that arrive in arbitrary pieces.
#include "bench/load/stream_parse.h"

#include <gtest/gtest.h>

namespace anvil::bench {
namespace {

TEST(LineSplitter, JoinsLinesSplitAcrossReadsAndDropsCr) {
  line_splitter s;
  EXPECT_TRUE(s.feed("{\"id\":1,").empty());
  auto lines = s.feed("\"text\":\"a\"}\r\n{\"id\":2}\n{\"id\"");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "{\"id\":1,\"text\":\"a\"}");
  EXPECT_EQ(lines[1], "{\"id\":2}");
  EXPECT_EQ(s.pending(), "{\"id\"");
  lines = s.feed(":3}\n");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "{\"id\":3}");
}

TEST(SseParser, EventsEndAtBlankLines) {
  sse_parser p;
  auto ev = p.feed("data: {\"a\":1}\n\ndata: [DONE]\n\n");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].data, "{\"a\":1}");
  EXPECT_EQ(ev[1].data, "[DONE]");
}

TEST(SseParser, EventSplitAnywhereAcrossReads) {
  const std::string stream = "data: {\"choices\":[{\"text\":\"hi\"}]}\r\n\r\n: ping\n\nevent: x\ndata:{\"b\":2}\n\ndata: [DONE]\n\n";
  // Every split point of the stream into two reads gives the same events.
  for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
    sse_parser p;
    auto ev = p.feed(stream.substr(0, cut));
    for (auto& e : p.feed(stream.substr(cut))) ev.push_back(e);
    ASSERT_EQ(ev.size(), 3u) << "cut at " << cut;
    EXPECT_EQ(ev[0].data, "{\"choices\":[{\"text\":\"hi\"}]}");
    EXPECT_EQ(ev[1].event, "x");
    EXPECT_EQ(ev[1].data, "{\"b\":2}");
    EXPECT_EQ(ev[2].data, "[DONE]");
  }
  // And byte by byte.
  sse_parser p;
  std::vector<sse_event> ev;
  for (char c : stream)
    for (auto& e : p.feed(std::string(1, c))) ev.push_back(e);
  EXPECT_EQ(ev.size(), 3u);
}

TEST(SseParser, MultipleDataLinesJoinAndFinishFlushes) {
  sse_parser p;
  auto ev = p.feed("data: one\ndata: two\n\ndata: tail");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "one\ntwo");
  ev = p.finish();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "tail");
  EXPECT_TRUE(p.finish().empty());
}

}  // namespace
}  // namespace anvil::bench
