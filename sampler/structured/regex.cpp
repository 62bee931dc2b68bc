// Pattern → syntax tree → Thompson NFA over bytes (code point ranges become UTF-8 byte-range
// sequences) → DFA by subset construction.
#include "sampler/structured/regex.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

namespace anvil::sampler::structured {
namespace {

constexpr char32_t max_cp = 0x10FFFF;
constexpr int max_repeat = 1000;
constexpr std::size_t max_nfa_states = 400000;

using cp_ranges = std::vector<std::pair<char32_t, char32_t>>;

// Sorted, merged ranges.
cp_ranges normalise(cp_ranges r) {
  std::sort(r.begin(), r.end());
  cp_ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

cp_ranges negate(const cp_ranges& r) {
  cp_ranges out;
  char32_t next = 0;
  for (const auto& [lo, hi] : normalise(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= max_cp) out.emplace_back(next, max_cp);
  return out;
}

struct node {
  enum class kind { empty, ranges, concat, alt, repeat } k = kind::empty;
  cp_ranges set;                          // ranges: one character of these
  std::vector<std::unique_ptr<node>> kids;  // concat / alt; repeat: kids[0]
  int min = 0, max = 0;                   // repeat: max -1 = unbounded
};
using node_ptr = std::unique_ptr<node>;

node_ptr make(node::kind k) {
  auto n = std::make_unique<node>();
  n->k = k;
  return n;
}

class parser {
 public:
  explicit parser(std::string_view p) : p_(p) {}

  node_ptr run() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    node_ptr n = alternation();
    if (i_ < p_.size()) fail("unexpected ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw structured_error("regex: " + what + " at offset " + std::to_string(i_));
  }
  bool at_end() const { return i_ >= p_.size(); }

  node_ptr alternation() {
    if (++depth_ > 200) fail("groups nest too deeply");
    auto alt = make(node::kind::alt);
    alt->kids.push_back(concatenation());
    while (!at_end() && p_[i_] == '|') {
      ++i_;
      alt->kids.push_back(concatenation());
    }
    --depth_;
    if (alt->kids.size() == 1) return std::move(alt->kids[0]);
    return alt;
  }

  node_ptr concatenation() {
    auto cat = make(node::kind::concat);
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$' && i_ + 1 == p_.size()) {  // the trailing anchor: the whole output matches anyway
        ++i_;
        break;
      }
      cat->kids.push_back(quantified(atom()));
    }
    return cat;
  }

  int number() {
    int v = 0;
    bool any = false;
    while (!at_end() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = std::min(v * 10 + (p_[i_] - '0'), 100000);
      ++i_;
      any = true;
    }
    if (!any) fail("a repeat count is missing");
    return v;
  }

  // At most one quantifier per atom: another one right after it is an error, as in Python's re
  // ("multiple repeat") and ECMAScript (and a stack of them would nest without bound).
  node_ptr quantified(node_ptr a) {
    if (at_end()) return a;
    int lo = 0, hi = 0;
    const char c = p_[i_];
    const auto count_follows = [&] { return !at_end() && p_[i_] == '{' && i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9'; };
    if (c == '*') {
      lo = 0, hi = -1;
      ++i_;
    } else if (c == '+') {
      lo = 1, hi = -1;
      ++i_;
    } else if (c == '?') {
      lo = 0, hi = 1;
      ++i_;
    } else if (count_follows()) {
      ++i_;
      lo = hi = number();
      if (!at_end() && p_[i_] == ',') {
        ++i_;
        hi = !at_end() && p_[i_] == '}' ? -1 : number();
      }
      if (at_end() || p_[i_] != '}') fail("'{' without its '}'");
      ++i_;
      if (lo > max_repeat || hi > max_repeat) fail("a repeat count over " + std::to_string(max_repeat));
      if (hi >= 0 && hi < lo) fail("a repeat range whose maximum is below its minimum");
    } else {
      return a;
    }
    if (!at_end() && (p_[i_] == '?' || p_[i_] == '+')) fail("lazy and possessive quantifiers are not supported");
    if (!at_end() && (p_[i_] == '*' || count_follows())) fail("a quantifier after a quantifier (multiple repeat)");
    auto r = make(node::kind::repeat);
    r->min = lo;
    r->max = hi;
    r->kids.push_back(std::move(a));
    return r;
  }

  // One UTF-8 character of the pattern.
  char32_t character() {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(p_[k]); };
    const unsigned char c = b(i_);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i_ + std::size_t(len) > p_.size()) fail("invalid UTF-8");
    char32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      if ((b(i_ + std::size_t(k)) & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (b(i_ + std::size_t(k)) & 0x3F);
    }
    i_ += std::size_t(len);
    return cp;
  }

  char32_t hex(int digits) {
    char32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (at_end()) fail("a hex escape is cut short");
      const char c = p_[i_++];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("a hex escape needs hex digits");
      v = v * 16 + char32_t(d);
    }
    return v;
  }

  // After a backslash: the ranges the escape stands for.
  cp_ranges escape() {
    if (at_end()) fail("a trailing backslash");
    const char c = p_[i_++];
    static const cp_ranges digit = {{'0', '9'}};
    static const cp_ranges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const cp_ranges space = {{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd': return digit;
      case 'D': return negate(digit);
      case 'w': return word;
      case 'W': return negate(word);
      case 's': return space;
      case 'S': return negate(space);
      case 'n': return {{'\n', '\n'}};
      case 't': return {{'\t', '\t'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': {
        const char32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        const char32_t v = hex(4);
        return {{v, v}};
      }
      case 'b': case 'B': case 'A': case 'Z': case 'z': case 'G':
        fail(std::string("the assertion \\") + c + " is not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(std::string("unknown escape \\") + c);
        return {{char32_t(static_cast<unsigned char>(c)), char32_t(static_cast<unsigned char>(c))}};
    }
  }

  cp_ranges char_class() {  // after '['
    bool negated = false;
    if (!at_end() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    cp_ranges set;
    bool first = true;
    for (;;) {
      if (at_end()) fail("'[' without its ']'");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      cp_ranges item;
      if (p_[i_] == '\\') {
        ++i_;
        item = escape();
      } else {
        const char32_t c = character();
        item = {{c, c}};
      }
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        char32_t hi = 0;
        if (p_[i_] == '\\') {
          ++i_;
          const cp_ranges e = escape();
          if (e.size() != 1 || e[0].first != e[0].second) fail("a class range must end in one character");
          hi = e[0].first;
        } else {
          hi = character();
        }
        if (hi < item[0].first) fail("a class range runs backwards");
        item[0].second = hi;
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    return negated ? negate(set) : normalise(set);
  }

  node_ptr atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (!at_end() && p_[i_] == '?') {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
          i_ += 2;
        } else {
          fail("lookaround and named groups are not supported");
        }
      }
      node_ptr inner = alternation();
      if (at_end() || p_[i_] != ')') fail("'(' without its ')'");
      ++i_;
      return inner;
    }
    auto n = make(node::kind::ranges);
    if (c == '[') {
      ++i_;
      n->set = char_class();
    } else if (c == '.') {
      ++i_;
      n->set = negate({{'\n', '\n'}});
    } else if (c == '\\') {
      ++i_;
      n->set = escape();
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      fail("a quantifier with nothing to repeat");
    } else {
      const char32_t cp = character();
      n->set = {{cp, cp}};
    }
    if (n->set.empty()) fail("a class that matches nothing");
    return n;
  }

  std::string_view p_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

// ---- NFA ----

struct nfa {
  struct state {
    std::vector<std::pair<std::pair<unsigned char, unsigned char>, std::int32_t>> edges;  // byte range → state
    std::vector<std::int32_t> eps;
  };
  std::vector<state> states;

  std::int32_t add() {
    if (states.size() >= max_nfa_states) throw structured_error("regex: the pattern is too large");
    states.emplace_back();
    return std::int32_t(states.size() - 1);
  }
};

struct frag {
  std::int32_t in, out;
};

void encode(char32_t c, unsigned char* b, int& n) {
  if (c < 0x80) {
    b[0] = static_cast<unsigned char>(c);
    n = 1;
  } else if (c < 0x800) {
    b[0] = static_cast<unsigned char>(0xC0 | (c >> 6));
    b[1] = static_cast<unsigned char>(0x80 | (c & 0x3F));
    n = 2;
  } else if (c < 0x10000) {
    b[0] = static_cast<unsigned char>(0xE0 | (c >> 12));
    b[1] = static_cast<unsigned char>(0x80 | ((c >> 6) & 0x3F));
    b[2] = static_cast<unsigned char>(0x80 | (c & 0x3F));
    n = 3;
  } else {
    b[0] = static_cast<unsigned char>(0xF0 | (c >> 18));
    b[1] = static_cast<unsigned char>(0x80 | ((c >> 12) & 0x3F));
    b[2] = static_cast<unsigned char>(0x80 | ((c >> 6) & 0x3F));
    b[3] = static_cast<unsigned char>(0x80 | (c & 0x3F));
    n = 4;
  }
}

// The code points [lo, hi] as sequences of byte ranges (each sequence one UTF-8 length).
void utf8_sequences(char32_t lo, char32_t hi, std::vector<std::vector<std::pair<unsigned char, unsigned char>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xD7FF && hi >= 0xD800) {  // no surrogates in UTF-8
    utf8_sequences(lo, 0xD7FF, out);
    utf8_sequences(0xE000, hi, out);
    return;
  }
  if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
  if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
  if (lo > hi) return;
  for (const char32_t edge : {char32_t(0x7F), char32_t(0x7FF), char32_t(0xFFFF)}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<unsigned char>(lo), static_cast<unsigned char>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const char32_t m = (char32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  unsigned char a[4], b[4];
  int na = 0, nb = 0;
  encode(lo, a, na);
  encode(hi, b, nb);
  std::vector<std::pair<unsigned char, unsigned char>> seq;
  for (int k = 0; k < na; ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(std::move(seq));
}

class builder {
 public:
  explicit builder(nfa& n) : n_(n) {}

  frag build(const node& x) {
    switch (x.k) {
      case node::kind::empty: {
        const std::int32_t s = n_.add();
        return {s, s};
      }
      case node::kind::ranges: {
        const std::int32_t in = n_.add(), out = n_.add();
        std::vector<std::vector<std::pair<unsigned char, unsigned char>>> seqs;
        for (const auto& [lo, hi] : x.set) utf8_sequences(lo, hi, seqs);
        for (const auto& seq : seqs) {
          std::int32_t at = in;
          for (std::size_t k = 0; k < seq.size(); ++k) {
            const std::int32_t to = k + 1 == seq.size() ? out : n_.add();
            n_.states[std::size_t(at)].edges.push_back({seq[k], to});
            at = to;
          }
        }
        return {in, out};
      }
      case node::kind::concat: {
        if (x.kids.empty()) return build(node{});
        frag f = build(*x.kids[0]);
        for (std::size_t k = 1; k < x.kids.size(); ++k) {
          const frag g = build(*x.kids[k]);
          n_.states[std::size_t(f.out)].eps.push_back(g.in);
          f.out = g.out;
        }
        return f;
      }
      case node::kind::alt: {
        const std::int32_t in = n_.add(), out = n_.add();
        for (const auto& kid : x.kids) {
          const frag g = build(*kid);
          n_.states[std::size_t(in)].eps.push_back(g.in);
          n_.states[std::size_t(g.out)].eps.push_back(out);
        }
        return {in, out};
      }
      case node::kind::repeat: {
        const std::int32_t in = n_.add();
        std::int32_t at = in;
        for (int k = 0; k < x.min; ++k) {
          const frag g = build(*x.kids[0]);
          n_.states[std::size_t(at)].eps.push_back(g.in);
          at = g.out;
        }
        const std::int32_t out = n_.add();
        if (x.max < 0) {  // a loop: at -> body -> at
          const frag g = build(*x.kids[0]);
          n_.states[std::size_t(at)].eps.push_back(g.in);
          n_.states[std::size_t(g.out)].eps.push_back(at);
          n_.states[std::size_t(at)].eps.push_back(out);
        } else {
          for (int k = x.min; k < x.max; ++k) {  // optional copies, each may end the repeat
            n_.states[std::size_t(at)].eps.push_back(out);
            const frag g = build(*x.kids[0]);
            n_.states[std::size_t(at)].eps.push_back(g.in);
            at = g.out;
          }
          n_.states[std::size_t(at)].eps.push_back(out);
        }
        return {in, out};
      }
    }
    return {0, 0};
  }

 private:
  nfa& n_;
};

std::vector<std::int32_t> closure(const nfa& n, std::vector<std::int32_t> set) {
  std::vector<char> seen(n.states.size(), 0);
  std::vector<std::int32_t> stack = set;
  for (const std::int32_t s : set) seen[std::size_t(s)] = 1;
  while (!stack.empty()) {
    const std::int32_t s = stack.back();
    stack.pop_back();
    for (const std::int32_t t : n.states[std::size_t(s)].eps) {
      if (!seen[std::size_t(t)]) {
        seen[std::size_t(t)] = 1;
        set.push_back(t);
        stack.push_back(t);
      }
    }
  }
  // Only states with byte edges (or the final one) matter for the subset's identity.
  std::sort(set.begin(), set.end());
  return set;
}

}  // namespace

std::int32_t dfa::walk(std::int32_t state, std::string_view bytes) const {
  for (const char c : bytes) {
    if (state == dead) return dead;
    state = next[std::size_t(state)][static_cast<unsigned char>(c)];
  }
  return state;
}

bool dfa::matches(std::string_view text) const {
  const std::int32_t s = walk(start, text);
  return s != dead && accepting[std::size_t(s)];
}

dfa compile_regex(std::string_view pattern, std::int32_t max_states) {
  const node_ptr tree = parser(pattern).run();
  nfa n;
  const frag f = builder(n).build(*tree);

  dfa d;
  std::map<std::vector<std::int32_t>, std::int32_t> ids;
  std::vector<std::vector<std::int32_t>> subsets;
  const auto id_of = [&](std::vector<std::int32_t> set) {
    auto [it, added] = ids.emplace(std::move(set), std::int32_t(subsets.size()));
    if (added) {
      if (std::int32_t(subsets.size()) >= max_states) {
        throw structured_error("regex: the pattern needs more than " + std::to_string(max_states) + " automaton states");
      }
      subsets.push_back(it->first);
      d.next.emplace_back();
      d.next.back().fill(dfa::dead);
      d.accepting.push_back(std::binary_search(it->first.begin(), it->first.end(), f.out));
    }
    return it->second;
  };
  d.start = id_of(closure(n, {f.in}));
  std::array<std::vector<std::int32_t>, 256> targets;
  for (std::size_t i = 0; i < subsets.size(); ++i) {
    for (auto& t : targets) t.clear();
    for (const std::int32_t s : subsets[i]) {
      for (const auto& [range, to] : n.states[std::size_t(s)].edges) {
        for (int b = range.first; b <= range.second; ++b) targets[std::size_t(b)].push_back(to);
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (targets[std::size_t(b)].empty()) continue;
      std::vector<std::int32_t> t = targets[std::size_t(b)];
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
      const std::int32_t to = id_of(closure(n, std::move(t)));
      d.next[i][std::size_t(b)] = to;
    }
  }
  return d;
}

void append_utf8(std::string& out, char32_t c) {
  unsigned char b[4];
  int n = 0;
  encode(c, b, n);
  out.append(reinterpret_cast<const char*>(b), std::size_t(n));
}

std::string escape_regex(std::string_view literal) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace anvil::sampler::structured
