// Small random-weight models for tests, written once per test process into its scratch folder.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/arch/synth.h"
#include "tests/scratch_dir.h"

namespace anvil::model::testing {

inline std::string synth_fixture(const std::string& shape, synth_mix mix, std::uint64_t seed = 1) {
  static std::map<std::string, std::string> made;
  const std::string key = shape + "-" + std::string(synth_mix_name(mix)) + "-" + std::to_string(seed);
  if (auto it = made.find(key); it != made.end()) return it->second;
  const auto& dir = anvil::testing::scratch_dir();
  const std::string path = (dir / (key + ".gguf")).string();
  synth_options opt;
  opt.shape = *find_synth_shape(shape);
  opt.mix = mix;
  opt.seed = seed;
  write_synth_model(opt, path);
  made[key] = path;
  return path;
}

// The tiny f32 model with a ChatML chat template (for the chat endpoints), written once per process.
inline const std::string& chatml_fixture() {
  static const std::string path = [] {
    const auto& dir = anvil::testing::scratch_dir();
    synth_options opt;
    opt.shape = *find_synth_shape("tiny");
    opt.mix = synth_mix::f32;
    opt.chat_template =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    const std::string p = (dir / "tiny-chatml.gguf").string();
    write_synth_model(opt, p);
    return p;
  }();
  return path;
}

// A tiny scripted model (synth_options::greedy_chain) with `chat_template`: after the generation
// prompt's last byte (`after`: "\n" by default; the synthetic vocabulary's byte b is token b) greedy decoding writes
// `pieces`, one user-defined token each (so they must be distinct; those in `control` are control
// tokens, as Mistral's [TOOL_CALLS] is), then <|im_end|>. For tests of what a server makes of an
// output: tool calls, reasoning. Written once per process per name.
inline std::string scripted_chat_fixture(const std::string& name, const std::string& chat_template,
                                         const std::vector<std::string>& pieces,
                                         const std::set<std::string>& control = {}, unsigned char after = '\n') {
  static std::map<std::string, std::string> made;
  if (auto it = made.find(name); it != made.end()) return it->second;
  const auto& dir = anvil::testing::scratch_dir();
  synth_options opt;
  opt.shape = *find_synth_shape("tiny");
  opt.mix = synth_mix::f32;
  tokenizer_spec tok = synthetic_tokenizer(opt.shape.n_vocab);
  constexpr std::int32_t first_free = 300, im_end = 258;
  std::int32_t prev = after;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const std::int32_t id = first_free + std::int32_t(i);
    tok.tokens[std::size_t(id)] = pieces[i];
    tok.token_types[std::size_t(id)] = control.contains(pieces[i]) ? 3 : 4;  // user-defined: printed as its text
    opt.greedy_chain.emplace_back(prev, id);
    prev = id;
  }
  opt.greedy_chain.emplace_back(prev, im_end);
  opt.tokenizer = std::move(tok);
  opt.chat_template = chat_template;
  const std::string path = (dir / ("scripted-" + name + ".gguf")).string();
  write_synth_model(opt, path);
  made[name] = path;
  return path;
}

}  // namespace anvil::model::testing
