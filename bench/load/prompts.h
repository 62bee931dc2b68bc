// prompts: what anvil-bench sends. Random prompts are strings of random common English words
// (about one token per word in BPE vocabularies) or, with --random-token-ids, arrays of random
// token ids (exact lengths); a dataset is a JSONL file of {"prompt": ...} or {"messages": [...]}
// lines, each with an optional "output_len". Seeded, so runs are reproducible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/load/bench_options.h"

namespace anvil::bench {

// One chat turn of a messages prompt.
struct chat_message {
  std::string role;     // "system", "user", "assistant"
  std::string content;  // its text
};

// One request's prompt. Exactly one of text, token_ids, messages is used: messages when not
// empty, else token_ids when not empty, else text.
struct bench_prompt {
  std::string text;                     // a text prompt
  std::vector<std::int64_t> token_ids;  // a prompt given as token ids
  std::vector<chat_message> messages;   // a conversation
  int output_len = 0;                   // max_tokens asked (ignore_eos makes it exact)
  std::int64_t estimated_input_len = 0;  // input length before the server says (exact for token ids)
};

// num_prompts random prompts of about input_len tokens (exactly, as token ids).
std::vector<bench_prompt> random_prompts(const bench_options& o);

// The first num_prompts lines of a JSONL dataset, cycling when it has fewer. Lines without
// "output_len" take `default_output_len`. nullopt with `error` set on an unreadable file or line.
std::optional<std::vector<bench_prompt>> load_dataset(const std::string& path, int num_prompts, int default_output_len,
                                                      std::string& error);

// The run's prompts: the dataset when given, else random ones.
std::optional<std::vector<bench_prompt>> make_prompts(const bench_options& o, std::string& error);

}  // namespace anvil::bench
