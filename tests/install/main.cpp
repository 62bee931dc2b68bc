// The installed in-process API from outside the tree: an engine on the installed shipped model (or
// the GGUF file given as argv[1]), a few greedy tokens, printed. Exits 0 when they came.
#include <cstdio>
#include <exception>

#include <boost/asio/use_future.hpp>

#include "engine/engine.h"

int main(int argc, char** argv) {
  if (argc > 2) {
    std::fprintf(stderr, "usage: %s [MODEL.gguf]\n", argv[0]);
    return 2;
  }
  try {
    auto eng = anvil::engine::create({.model_path = argc == 2 ? argv[1] : ANVIL_SHIPPED_MODEL});
    anvil::generate_request req;
    req.prompt = "And God said";
    req.max_tokens = 8;   // sampling.temperature is 0: greedy
    const anvil::completion c = eng->async_generate(req, boost::asio::use_future).get();
    eng->async_stop(boost::asio::use_future).get();
    std::printf("%s|%s\n%zu tokens:", req.prompt.c_str(), c.text.c_str(), c.tokens.size());
    for (const auto t : c.tokens) std::printf(" %d", t);
    std::printf(" (finish: %s)\n", c.finish_reason.c_str());
    return c.tokens.empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anvil_consumer: %s\n", e.what());
    return 1;
  }
}
