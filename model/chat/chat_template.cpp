// Chat templates: recognition of the real Jinja sources by content, and the C++ renderers that
// reproduce them. Each renderer names the template expressions it mirrors; the Python string
// semantics they depend on (str.strip(), split()) are reproduced exactly, since a single
// stray space changes the tokens the model sees.
#include "model/chat/chat_template.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/model_error.h"

namespace anvil::model {
namespace {

using messages_view = std::span<const chat_message>;
constexpr auto npos = std::string_view::npos;

// ---- Python string semantics ----------------------------------------------------------------

// Python's str.isspace() code points: what Jinja's trim filter and str.strip() remove.
bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point whose UTF-8 encoding is exactly `s`, or nullopt for anything else: an
// invalid, overlong or partial sequence is never whitespace (Python could not have decoded it).
std::optional<char32_t> decode_exact(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  if (s.size() == 1 && b(0) < 0x80) return b(0);
  const std::size_t len = s.empty() || b(0) >= 0xf8 ? 0 : b(0) >= 0xf0 ? 4 : b(0) >= 0xe0 ? 3 : b(0) >= 0xc0 ? 2 : 0;
  if (len < 2 || len != s.size()) return std::nullopt;
  char32_t c = b(0) & (0x7f >> len);
  for (std::size_t i = 1; i < len; ++i) {
    if ((b(i) & 0xc0) != 0x80) return std::nullopt;
    c = (c << 6) | (b(i) & 0x3f);
  }
  constexpr std::array<char32_t, 5> shortest = {0, 0, 0x80, 0x800, 0x10000};
  return c >= shortest[len] ? std::optional(c) : std::nullopt;
}

std::size_t utf8_length(unsigned char lead) {
  return lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
}

// str.strip() with no argument.
std::string_view py_strip(std::string_view s) {
  while (!s.empty()) {
    const std::size_t n = std::min(utf8_length(static_cast<unsigned char>(s[0])), s.size());
    const auto c = decode_exact(s.substr(0, n));
    if (!c || !is_py_space(*c)) break;
    s.remove_prefix(n);
  }
  while (!s.empty()) {
    std::size_t start = s.size() - 1;  // back up over continuation bytes to the lead byte
    while (start > 0 && s.size() - start < 4 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) {
      --start;
    }
    const auto c = decode_exact(s.substr(start));
    if (!c || !is_py_space(*c)) break;
    s.remove_suffix(s.size() - start);
  }
  return s;
}

// str.lstrip('\n') / str.rstrip('\n') / str.strip('\n').
std::string_view lstrip_newlines(std::string_view s) {
  return s.substr(std::min(s.find_first_not_of('\n'), s.size()));
}
std::string_view rstrip_newlines(std::string_view s) { return s.substr(0, s.find_last_not_of('\n') + 1); }
std::string_view strip_newlines(std::string_view s) { return rstrip_newlines(lstrip_newlines(s)); }

// s.split(sep)[-1] and s.split(sep)[0].
std::string_view after_last(std::string_view s, std::string_view sep) {
  const std::size_t at = s.rfind(sep);
  return at == npos ? s : s.substr(at + sep.size());
}
std::string_view before_first(std::string_view s, std::string_view sep) { return s.substr(0, s.find(sep)); }

// ---- Template source in canonical form --------------------------------------------------------

// Reads the string literal opening at s[i] (either quote); returns its value and the index
// past it. Decodes the escapes templates use; any other escape is kept as written.
std::pair<std::string, std::size_t> read_literal(std::string_view s, std::size_t i) {
  const char quote = s[i++];
  std::string value;
  while (i < s.size() && s[i] != quote) {
    const char c = s[i++];
    if (c != '\\' || i == s.size()) {
      value += c;
      continue;
    }
    const char e = s[i++];
    switch (e) {
      case 'n': value += '\n'; break;
      case 't': value += '\t'; break;
      case 'r': value += '\r'; break;
      case '\\': case '\'': case '"': value += e; break;
      default: value += '\\'; value += e;
    }
  }
  return {std::move(value), std::min(i + 1, s.size())};
}

std::string quoted(std::string_view value) {
  std::string out = "'";
  for (const char c : value) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      case '\'': out += "\\'"; break;
      default: out += c;
    }
  }
  return out + "'";
}

bool is_identifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (const char c : s) {
    const bool word = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!word) return false;
  }
  return true;
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Template source in a canonical form, so markers match however a template is formatted:
// inside {{ }} and {% %} blocks whitespace outside string literals is dropped, ['name'] becomes
// .name, and string literals are re-quoted as '...' with \n escapes (a literal holding a real
// newline matches one written "\n"); comments are dropped and text outside blocks is kept.
class canonical_source {
 public:
  explicit canonical_source(std::string_view source, bool starts_in_block = false) {
    scan(source, starts_in_block);
  }

  // True when the Jinja expression fragment `marker` occurs in the source.
  bool has(std::string_view marker) const {
    return text_.find(canonical_source(marker, true).text_) != std::string::npos;
  }
  bool has_all(std::initializer_list<std::string_view> markers) const {
    for (const auto m : markers) {
      if (!has(m)) return false;
    }
    return true;
  }

  // Value of the string literal right after some occurrence of `prefix` (canonical text).
  std::optional<std::string> literal_after(std::string_view prefix) const {
    for (auto at = text_.find(prefix); at != std::string::npos; at = text_.find(prefix, at + 1)) {
      const std::size_t lit = at + prefix.size();
      if (lit < text_.size() && text_[lit] == '\'') return read_literal(text_, lit).first;
    }
    return std::nullopt;
  }

  const std::vector<std::string>& literals() const { return literals_; }
  bool any_literal_contains(std::string_view text) const {
    for (const std::string& lit : literals_) {
      if (lit.find(text) != std::string::npos) return true;
    }
    return false;
  }

 private:
  void scan(std::string_view s, bool in_block) {
    std::size_t i = 0;
    while (i < s.size()) {
      const std::string_view two = s.substr(i, 2);
      if (!in_block) {
        if (two == "{#") {
          const std::size_t end = s.find("#}", i + 2);
          i = end == npos ? s.size() : end + 2;
        } else {
          in_block = two == "{{" || two == "{%";
          text_ += in_block ? two : s.substr(i, 1);
          i += in_block ? 2 : 1;
        }
      } else if (two == "}}" || two == "%}") {
        text_ += two;
        i += 2;
        in_block = false;
      } else if (is_blank(s[i])) {
        ++i;
      } else if (s[i] == '\'' || s[i] == '"') {
        auto [value, next] = read_literal(s, i);
        text_ += quoted(value);
        literals_.push_back(std::move(value));
        i = next;
      } else if (s[i] == '[' && subscript(s, i)) {
        // rewritten as .name
      } else {
        text_ += s[i++];
      }
    }
  }

  // Rewrites ['name'] at s[i] as .name; false (and nothing consumed) for any other subscript.
  bool subscript(std::string_view s, std::size_t& i) {
    std::size_t j = i + 1;
    while (j < s.size() && is_blank(s[j])) ++j;
    if (j == s.size() || (s[j] != '\'' && s[j] != '"')) return false;
    auto [name, k] = read_literal(s, j);
    while (k < s.size() && is_blank(s[k])) ++k;
    if (k == s.size() || s[k] != ']' || !is_identifier(name)) return false;
    text_ += '.' + name;
    i = k + 1;
    return true;
  }

  std::string text_;
  std::vector<std::string> literals_;
};

// ---- Recognition ------------------------------------------------------------------------------

constexpr std::string_view chatml_turn =
    "'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'";
constexpr std::string_view chatml_generation = "'<|im_start|>assistant\\n'";
constexpr std::string_view alternation_check = "(message['role'] == 'user') != (loop.index0 % 2 == 0)";

// Qwen3's hybrid-thinking template: ChatML turns, reasoning shown only after the last query,
// and the enable_thinking switch. Later Qwen3 templates (-2507) differ and are not matched.
std::optional<chat_style> recognise_qwen3(const canonical_source& t) {
  if (!t.has_all({chatml_turn, chatml_generation, "ns.last_query_index", "reasoning_content",
                  "'<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
                  "'\\n</think>\\n\\n' + content.lstrip('\\n')",
                  "enable_thinking is defined and enable_thinking is false"})) {
    return std::nullopt;
  }
  return chat_style{.family = chat_family::qwen3};
}

// ChatML turns and nothing else printed: no BOS/EOS (InternLM2 prints them), no <think>
// handling (QwQ, Qwen3). Qwen2/2.5 templates insert a default system turn, found as the literal
// '<|im_start|>system\n<text><|im_end|>\n'; a template without one is plain ChatML.
std::optional<chat_style> recognise_chatml(const canonical_source& t) {
  if (!t.has_all({chatml_turn, chatml_generation}) || t.has("bos_token") || t.has("eos_token") ||
      t.any_literal_contains("think>")) {
    return std::nullopt;
  }
  chat_style style{.family = chat_family::chatml};
  constexpr std::string_view open = "<|im_start|>system\n", close = "<|im_end|>\n";
  for (const std::string& lit : t.literals()) {
    if (lit.size() > open.size() + close.size() && lit.starts_with(open) && lit.ends_with(close)) {
      style.default_system = lit.substr(open.size(), lit.size() - open.size() - close.size());
      break;
    }
  }
  return style;
}

// Llama 3 turns; 3.1+ add the dated system header, whose date is either the template's
// date_string default (3.1) or strftime_now(format) (3.2).
std::optional<chat_style> recognise_llama3(const canonical_source& t) {
  if (!t.has("'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
             "message['content'] | trim + '<|eot_id|>'")) {
    return std::nullopt;
  }
  chat_style style{.family = chat_family::llama3};
  if (t.has_all({"bos_token", "'Cutting Knowledge Date: December 2023\\n'", "'Today Date: ' + date_string + '\\n\\n'",
                 "messages[0]['content'] | trim", "add_generation_prompt"})) {
    style.dated_system_header = true;
    style.date_string = t.literal_after("date_string=").value_or("");
    style.date_format = t.literal_after("strftime_now(").value_or("");
    if (style.date_string.empty() && style.date_format.empty()) return std::nullopt;
    return style;
  }
  if (!t.has("bos_token + content")) return std::nullopt;
  style.generation_prompt_always = !t.has("add_generation_prompt");
  return style;
}

// The Llama-2-chat template: BOS before every [INST], the system message folded into the first
// user turn between <<SYS>> markers, turns stripped (.strip() or CodeLlama's | trim).
std::optional<chat_style> recognise_llama2(const canonical_source& t) {
  const bool strip = t.has_all({"bos_token + '[INST] ' + content.strip() + ' [/INST]'",
                                "' ' + content.strip() + ' ' + eos_token"});
  const bool trim = t.has_all({"bos_token + '[INST] ' + content | trim + ' [/INST]'",
                               "' ' + content | trim + ' ' + eos_token"});
  const auto sys = "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content']";
  if (!(strip || trim) || !t.has_all({alternation_check, sys})) {
    return std::nullopt;
  }
  return chat_style{.family = chat_family::llama2};
}

// Mistral-7B-Instruct v0.1/v0.2 ("[INST] ", no system role) and the later "v1" revision
// (" [INST] ", optional system message). Newer [INST] formats (v3 tool markers, v7 system
// prompts) print turns differently and are not matched.
std::optional<chat_style> recognise_mistral(const canonical_source& t) {
  if (!t.has_all({alternation_check, "bos_token"}) || t.any_literal_contains("<<SYS>>") ||
      t.any_literal_contains("[AVAILABLE_TOOLS]") || t.any_literal_contains("[SYSTEM_PROMPT]")) {
    return std::nullopt;
  }
  if (t.has_all({"' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]'",
                 "' [INST] ' + message['content'] + ' [/INST]'", "' ' + message['content'] + eos_token"})) {
    return chat_style{.family = chat_family::mistral, .mistral_v1 = true};
  }
  if (!t.has("'[INST] ' + message['content'] + ' [/INST]'") || t.has("system_message")) return std::nullopt;
  if (t.has("message['content'] + eos_token + ' '")) {
    return chat_style{.family = chat_family::mistral, .space_after_eos = true};
  }
  if (t.has("message['content'] + eos_token")) return chat_style{.family = chat_family::mistral};
  return std::nullopt;
}

std::optional<chat_style> recognise(std::string_view source) {
  const canonical_source t(source);
  // Qwen3 before ChatML: the ChatML rule refuses <think> templates rather than guess.
  for (const auto rule :
       {recognise_qwen3, recognise_chatml, recognise_llama3, recognise_llama2, recognise_mistral}) {
    if (auto style = rule(t)) return style;
  }
  return std::nullopt;
}

// The first 60 code points, newlines shown as \n, for error messages.
std::string preview(std::string_view source) {
  std::string out;
  std::size_t i = 0;
  for (int chars = 0; i < source.size() && chars < 60; ++chars) {
    const std::size_t n = std::min(utf8_length(static_cast<unsigned char>(source[i])), source.size() - i);
    out += source[i] == '\n' ? std::string_view("\\n") : source.substr(i, n);
    i += n;
  }
  return i < source.size() ? out + "..." : out;
}

// ---- Validation -------------------------------------------------------------------------------

std::string at(std::size_t i) { return "chat message " + std::to_string(i) + ": "; }

void check_roles(messages_view m) {
  if (m.empty()) throw model_error("chat template: no messages to render");
  for (std::size_t i = 0; i < m.size(); ++i) {
    const std::string& role = m[i].role;
    if (role == "tool" || role == "ipython") {
      throw model_error(at(i) + "role '" + role + "' is not supported (anvil renders no tool calls or results)");
    }
    if (role != "system" && role != "user" && role != "assistant") {
      throw model_error(at(i) + "unknown role '" + role + "' (expected system, user or assistant)");
    }
  }
}

// Llama 2 and Mistral: an optional leading system message, then turns alternating user,
// assistant, user... The real templates raise for most breaks of this rule but silently drop
// a system message at an odd position, or one with no user turn after it; those are refused too.
void check_alternating(messages_view m, bool system_allowed) {
  std::size_t first = 0;
  if (m[0].role == "system") {
    if (!system_allowed) {
      throw model_error(at(0) + "this Mistral template supports only user and assistant roles (no system message)");
    }
    if (m.size() == 1) throw model_error(at(0) + "a system message needs a user message after it");
    first = 1;
  }
  for (std::size_t i = first; i < m.size(); ++i) {
    if (m[i].role == "system") throw model_error(at(i) + "a system message may only come first");
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (m[i].role != want) {
      throw model_error(at(i) + "roles must alternate user/assistant/user/... after the optional system "
                        "message; got '" + m[i].role + "' where '" + want + "' was expected");
    }
  }
}

// ---- Renderers --------------------------------------------------------------------------------

void append_im_turn(std::string& out, std::string_view role, std::string_view content) {
  out.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
}

// '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' per message.
std::string render_chatml(const chat_style& s, messages_view m, bool add_generation_prompt) {
  std::string out;
  if (s.default_system && m[0].role != "system") append_im_turn(out, "system", *s.default_system);
  for (const chat_message& msg : m) append_im_turn(out, msg.role, msg.content);
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// ns.last_query_index: the last user message that is a real query rather than a wrapped tool
// response; assistant reasoning is shown only after it.
std::size_t last_query_index(messages_view m) {
  for (std::size_t i = m.size(); i-- > 0;) {
    const std::string& c = m[i].content;
    if (m[i].role == "user" && !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) return i;
  }
  return m.size() - 1;
}

// Qwen3's assistant turn: '</think>' splits reasoning from the answer; the <think> block is
// re-emitted only after the last query, for the final message or when reasoning is non-empty.
void append_qwen3_assistant(std::string& out, std::string_view text, bool after_last_query, bool last) {
  std::string_view content = text, reasoning;
  if (text.find("</think>") != npos) {
    content = lstrip_newlines(after_last(text, "</think>"));
    reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(text, "</think>")), "<think>"));
  }
  out += "<|im_start|>assistant\n";
  if (after_last_query && (last || !reasoning.empty())) {
    out.append("<think>\n").append(strip_newlines(reasoning)).append("\n</think>\n\n");
    out.append(lstrip_newlines(content));
  } else {
    out += content;
  }
  out += "<|im_end|>\n";
}

std::string render_qwen3(messages_view m, bool add_generation_prompt) {
  std::string out;
  if (m[0].role == "system") append_im_turn(out, "system", m[0].content);
  const std::size_t last_query = last_query_index(m);
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == "assistant") {
      append_qwen3_assistant(out, m[i].content, i > last_query, i + 1 == m.size());
    } else if (i > 0 || m[i].role != "system") {
      append_im_turn(out, m[i].role, m[i].content);
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'.
void append_header_turn(std::string& out, std::string_view role, std::string_view content) {
  out.append("<|start_header_id|>").append(role).append("<|end_header_id|>\n\n");
  out.append(py_strip(content)).append("<|eot_id|>");
}

std::string render_llama3(const chat_style& s, const std::string& bos, const std::string& date,
                          messages_view m, bool add_generation_prompt) {
  std::string out = bos;  // 3.0 prefixes the first turn with it, 3.1+ the whole prompt
  std::size_t first = 0;
  if (s.dated_system_header) {
    const bool has_system = m[0].role == "system";
    out.append("<|start_header_id|>system<|end_header_id|>\n\n");
    out.append("Cutting Knowledge Date: December 2023\nToday Date: ").append(date).append("\n\n");
    out.append(has_system ? py_strip(m[0].content) : "").append("<|eot_id|>");
    first = has_system ? 1 : 0;
  }
  for (std::size_t i = first; i < m.size(); ++i) append_header_turn(out, m[i].role, m[i].content);
  if (add_generation_prompt || s.generation_prompt_always) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

// bos + '[INST] ' + content.strip() + ' [/INST]' and ' ' + content.strip() + ' ' + eos, the
// system message wrapped in <<SYS>> at the head of the first user turn (before the strip).
std::string render_llama2(const std::string& bos, const std::string& eos, messages_view m) {
  check_alternating(m, true);
  const bool has_system = m[0].role == "system";
  std::string out;
  for (std::size_t i = has_system ? 1 : 0; i < m.size(); ++i) {
    std::string content = m[i].content;
    if (has_system && i == 1) content = "<<SYS>>\n" + m[0].content + "\n<</SYS>>\n\n" + content;
    if (m[i].role == "user") {
      out.append(bos).append("[INST] ").append(py_strip(content)).append(" [/INST]");
    } else {
      out.append(" ").append(py_strip(content)).append(" ").append(eos);
    }
  }
  return out;
}

// bos, then '[INST] ' + content + ' [/INST]' and content + eos (v0.1 adds ' '); v1 puts a
// space before [INST] and before each reply, and the system message + '\n\n' in the first turn.
std::string render_mistral(const chat_style& s, const std::string& bos, const std::string& eos, messages_view m) {
  check_alternating(m, s.mistral_v1);
  const bool has_system = m[0].role == "system";
  std::string out = bos;
  for (std::size_t i = has_system ? 1 : 0; i < m.size(); ++i) {
    if (m[i].role == "user") {
      out += s.mistral_v1 ? " [INST] " : "[INST] ";
      if (has_system && i == 1) out.append(m[0].content).append("\n\n");
      out.append(m[i].content).append(" [/INST]");
    } else {
      out.append(s.mistral_v1 ? " " : "").append(m[i].content).append(eos);
      if (s.space_after_eos) out += ' ';
    }
  }
  return out;
}

// strftime_now(format) as transformers defines it: datetime.now().strftime(format), local time.
std::string today(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::array<char, 128> buf{};
  return std::string(buf.data(), std::strftime(buf.data(), buf.size(), format.c_str(), &local));
}

}  // namespace

std::string_view family_name(chat_family f) {
  switch (f) {
    case chat_family::chatml: return "chatml";
    case chat_family::qwen3: return "qwen3";
    case chat_family::llama3: return "llama3";
    case chat_family::llama2: return "llama2";
    case chat_family::mistral: return "mistral";
  }
  return "unknown";
}

std::optional<chat_family> detect_chat_family(std::string_view template_source) {
  const auto style = recognise(template_source);
  return style ? std::optional(style->family) : std::nullopt;
}

chat_template::chat_template(std::string_view template_source, std::string bos_token, std::string eos_token)
    : bos_(std::move(bos_token)), eos_(std::move(eos_token)) {
  auto style = recognise(template_source);
  if (!style) {
    throw model_error("unrecognised chat template: " + preview(template_source) +
                      " (anvil renders ChatML/Qwen2.5, Qwen3, Llama 3, Llama 2 and Mistral templates)");
  }
  style_ = std::move(*style);
}

chat_template::chat_template(chat_style style, std::string bos_token, std::string eos_token)
    : style_(std::move(style)), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {}

chat_template chat_template::for_family(chat_family f, std::string bos_token, std::string eos_token) {
  return chat_template(chat_style{.family = f}, std::move(bos_token), std::move(eos_token));
}

void chat_template::set_date_string(std::string date) {
  style_.date_string = std::move(date);
  style_.date_format.clear();
}

std::string chat_template::render(std::span<const chat_message> messages, bool add_generation_prompt) const {
  check_roles(messages);
  switch (style_.family) {
    case chat_family::chatml: return render_chatml(style_, messages, add_generation_prompt);
    case chat_family::qwen3: return render_qwen3(messages, add_generation_prompt);
    case chat_family::llama3: {
      const std::string date = style_.date_format.empty() ? style_.date_string : today(style_.date_format);
      return render_llama3(style_, bos_, date, messages, add_generation_prompt);
    }
    case chat_family::llama2: return render_llama2(bos_, eos_, messages);
    case chat_family::mistral: return render_mistral(style_, bos_, eos_, messages);
  }
  throw model_error("chat template: unknown family");
}

}  // namespace anvil::model
