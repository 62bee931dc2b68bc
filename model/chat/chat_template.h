// Chat templates: turn OpenAI-style messages into the prompt text a model was trained on.
// A GGUF carries its template as Jinja source (tokenizer.chat_template). anvil does not run
// Jinja: it recognises the common families by markers in that source and renders them in C++,
// byte for byte what HF transformers' apply_chat_template(tokenize=False) produces with the real
// template (tests/data/chat/goldens.json, made by tools/chat/render_goldens.py, checks this).
// A template it does not recognise is refused rather than approximated, since a wrong prompt
// format silently degrades every answer.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace anvil::model {

struct chat_message {
  std::string role;     // "system", "user" or "assistant"; "tool" is refused
  std::string content;  // UTF-8 text, rendered as given (some templates trim it)
};

enum class chat_family { chatml, qwen3, llama3, llama2, mistral };

std::string_view family_name(chat_family f);

// The family a template source belongs to, by content markers; nullopt when none matches.
std::optional<chat_family> detect_chat_family(std::string_view template_source);

// How one recognised template renders. Filled in by recognition (or for_family); the fields say
// how the real templates within a family differ, so a test or a log line can show which one it is.
struct chat_style {
  chat_family family = chat_family::chatml;
  // chatml: the system turn Qwen2/2.5 templates insert when the conversation has none
  // (Qwen2.5: "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."), taken from
  // the template's own '<|im_start|>system\n...<|im_end|>\n' literal; plain ChatML has none.
  std::optional<std::string> default_system{};
  // llama3: 3.1+ templates open with a system header carrying "Cutting Knowledge Date" and
  // "Today Date" lines. The date is date_string (3.1: "26 Jul 2024") unless date_format is set
  // (3.2: strftime_now("%d %b %Y"), i.e. today's local date, as transformers renders it).
  bool dated_system_header = false;
  std::string date_string{};
  std::string date_format{};
  // llama3: the first Meta-Llama-3-Instruct template appended the assistant header even when
  // add_generation_prompt was false; later revisions made it conditional.
  bool generation_prompt_always = false;
  // mistral: the "v1" template (" [INST] ", a space before replies, an optional system message
  // merged into the first user turn); otherwise the v0.1/v0.2 one, which has no system role.
  bool mistral_v1 = false;
  bool space_after_eos = false;  // mistral v0.1: "</s> " between turns
};

class chat_template {
 public:
  // Recognises the family; throws model_error("unrecognised chat template: <first 60 chars>")
  // otherwise. bos/eos are the tokenizer's BOS/EOS token strings (Llama 2/3 and Mistral print them).
  chat_template(std::string_view template_source, std::string bos_token, std::string eos_token);

  // For a GGUF without a template when the caller knows the family: plain ChatML, Qwen3,
  // Llama 3 (Meta-Llama-3-Instruct, no date header), Llama 2 chat, Mistral v0.2.
  static chat_template for_family(chat_family f, std::string bos_token, std::string eos_token);

  chat_family family() const { return style_.family; }
  const chat_style& style() const { return style_; }

  // What passing date_string= to apply_chat_template does: fixes the "Today Date" of Llama 3.1+
  // templates (tests use it to pin 3.2's date). No effect on other templates.
  void set_date_string(std::string date);

  // Throws model_error for conversations the template would reject (empty, unknown role, tool
  // messages, Llama 2/Mistral turns not alternating user/assistant after one optional leading
  // system message), and for those it would silently drop a message from. Llama 2 and Mistral
  // templates end a user turn with [/INST] and, like the real ones, ignore add_generation_prompt.
  std::string render(std::span<const chat_message> messages, bool add_generation_prompt) const;

 private:
  chat_template(chat_style style, std::string bos_token, std::string eos_token);

  chat_style style_;
  std::string bos_;
  std::string eos_;
};

}  // namespace anvil::model
