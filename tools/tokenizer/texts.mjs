// Seeded generators of varied test strings for the tokenizer goldens. Every string is built from
// characters assigned by Unicode 14 (the version of Debian 12's PCRE2 and of the NFC tables), so
// a letter is a letter on both sides of the comparison. Left out on purpose, because reference
// implementations disagree about them (see README.md): U+0085 NEL, U+FEFF BOM and U+180E, whose
// status as whitespace differs between JavaScript's \s and Unicode White_Space.

// mulberry32: small, fast, deterministic.
export function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const r = {
    next,
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)), // inclusive
    pick: (arr) => arr[Math.floor(next() * arr.length)],
    chance: (p) => next() < p,
    cp: (lo, hi) => String.fromCodePoint(r.int(lo, hi)),
    times: (n, f) => Array.from({ length: n }, f).join(""),
  };
  return r;
}

const words = (
  "the of and to in is was that for it with as his on be at by had are but from or have an they which one you were " +
  "her all she there would their we him been has when who will more no if out so said what up its about into than " +
  "them can only other new some could time these two may then do first any my now such like our over man me even most " +
  "made after also did many before must through back years where much your way well down should because each just " +
  "those people how too little state good very make world still own see men work long get here between both life being " +
  "under never day same another know while last might us great old year off come since against go came right used take " +
  "three tokenizer inference runtime GPU kernel cache batch token model llama qwen CUDA HIP tensor matrix vector"
).split(" ");

const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"];

function randomCase(r, s) {
  switch (r.int(0, 3)) {
    case 0: return s.toUpperCase();
    case 1: return s.toLowerCase();
    case 2: return s[0].toUpperCase() + s.slice(1);
    default: return [...s].map((c) => (r.chance(0.5) ? c.toUpperCase() : c.toLowerCase())).join("");
  }
}

export function prose(r) {
  const sentences = r.int(1, 4);
  let out = "";
  for (let s = 0; s < sentences; ++s) {
    const n = r.int(3, 14);
    const ws = [];
    for (let i = 0; i < n; ++i) {
      let w = r.pick(words);
      if (i === 0) w = w[0].toUpperCase() + w.slice(1);
      if (r.chance(0.08)) w += r.pick(contractions);
      if (r.chance(0.1)) w += r.pick([",", ";", ":"]);
      if (r.chance(0.04)) w = `"${w}"`;
      if (r.chance(0.03)) w = `(${w})`;
      ws.push(w);
    }
    out += (s ? " " : "") + ws.join(" ") + r.pick([".", ".", ".", "!", "?", "...", ""]);
  }
  return out;
}

export function contractionText(r) {
  const pieces = [];
  for (let i = r.int(1, 6); i > 0; --i) {
    const base = r.pick(["don", "can", "I", "you", "we", "they", "it", "she", "he", "that", "there", "o", ""]);
    const c = randomCase(r, r.pick(contractions).slice(1));
    const apostrophe = r.pick(["'", "'", "'", "\u2019", "''"]);
    pieces.push(randomCase(r, base || "x") + apostrophe + c + (r.chance(0.2) ? r.pick(contractions) : ""));
  }
  return pieces.join(r.pick([" ", "  ", "\n", ", ", ""]));
}

const indents = ["", "  ", "    ", "        ", "\t", "\t\t", " \t"];
const codeLines = [
  "def {f}({a}, {b}=None):", "return {a} + {b} * {n}", "for i in range({n}):", "if ({a} != {b}) {", "}",
  "int {f}(const char* {a}, size_t {b});", "const {a} = await {f}({b}, {n});", "x[{n}] = {a}->{b};",
  "# TODO({a}): fix {f}", "// {f}: {a} -> {b}", "/* {a} */", "{\"{a}\": {n}, \"{b}\": [{n}, {n}]}",
  "echo \"$({f} {a})\" | grep -E '^[a-z]+$' >> /tmp/{b}.log", "SELECT {a}, {b} FROM t WHERE id = {n};",
  "std::vector<int> {a}{{n}};", "print(f\"{{{a}!r}} = {{{b}:.3f}}\")", "{a} <= {b} && {a} >= -{n} || !{b}",
  "```python", "```", "<div class=\"{a}\">{b}</div>", "@decorator({n})", "lambda {a}: {a}**2",
];

export function code(r) {
  const lines = [];
  for (let i = r.int(1, 8); i > 0; --i) {
    const line = r.pick(codeLines)
      .replaceAll("{f}", r.pick(["main", "encode", "_decode", "getValue", "x2", "forward"]))
      .replaceAll("{a}", r.pick(["self", "tokens", "buf", "n_vocab", "idx", "x"]))
      .replaceAll("{b}", r.pick(["other", "len", "out_ptr", "y", "ctx"]))
      .replaceAll("{n}", String(r.int(0, 100000)));
    lines.push(r.pick(indents) + line + (r.chance(0.1) ? " ".repeat(r.int(1, 3)) : ""));
  }
  return lines.join(r.pick(["\n", "\n", "\n", "\r\n", "\n\n"]));
}

export function cjk(r) {
  const parts = [];
  for (let i = r.int(1, 6); i > 0; --i) {
    switch (r.int(0, 5)) {
      case 0: parts.push(r.times(r.int(1, 12), () => r.cp(0x4e00, 0x9fa5))); break; // CJK ideographs
      case 1: parts.push(r.times(r.int(1, 8), () => r.cp(0x3041, 0x3096))); break; // hiragana
      case 2: parts.push(r.times(r.int(1, 8), () => r.cp(0x30a1, 0x30fa))); break; // katakana
      case 3: parts.push(r.times(r.int(1, 5), () => r.cp(0xac00, 0xd7a3))); break; // Hangul syllables
      case 4: parts.push(r.pick(["，", "。", "！", "？", "《", "》", "「", "」", "：", "；", "、", "…"])); break;
      default: parts.push(r.times(r.int(1, 4), () => r.pick([r.cp(0xff10, 0xff19), r.cp(0xff21, 0xff3a), r.cp(0xff41, 0xff5a)])));
    }
  }
  return parts.join(r.pick(["", "", " ", "\n"]));
}

const emojis = [
  "😀", "😂", "🤖", "🚀", "🔥", "👍", "👍🏽", "👋🏿", "❤️", "❤", "✨", "🎉", "🇺🇸", "🇯🇵", "🇩🇪", "1️⃣", "#️⃣", "©️",
  "👨‍👩‍👧‍👦", "🏳️‍🌈", "🧑‍💻", "👩🏽‍🚀", "🏴‍☠️", "🐈‍⬛", "😶‍🌫️", "🫠", "🥲", "☕", "⌚", "♻️", "🀄", "🃏",
];

export function emoji(r) {
  const parts = [];
  for (let i = r.int(1, 6); i > 0; --i) parts.push(r.chance(0.6) ? r.pick(emojis) : r.pick(words));
  return parts.join(r.pick(["", " ", "  ", "\n"]));
}

// Base letters with stacked combining marks, precomposed and decomposed accents, and scripts that
// live on marks (Devanagari, Arabic, Hebrew, Thai), plus conjoining Hangul jamo (NFC composes them).
export function combining(r) {
  const parts = [];
  for (let i = r.int(1, 5); i > 0; --i) {
    switch (r.int(0, 7)) {
      case 0: parts.push(r.pick("aeiouqxAEIOUnNcC".split("")) + r.times(r.int(1, 3), () => r.cp(0x300, 0x36f))); break;
      case 1: parts.push(r.pick(["café", "naïve", "Ångström", "Tiếng Việt", "façade", "Øre", "smörgåsbord", "ẞtraße"])); break;
      case 2: parts.push(r.pick(["café", "naïve", "Ångström", "Tiếng Việt", "résumé", "piñata", "Ωμέγα"]).normalize("NFD")); break;
      case 3: parts.push(r.times(r.int(1, 4), () => r.cp(0x915, 0x939) + (r.chance(0.5) ? r.pick(["्", "ा", "ि", "ी", "ु", "े", "ं", "़"]) : ""))); break;
      case 4: parts.push(r.times(r.int(1, 5), () => r.cp(0x627, 0x64a) + (r.chance(0.5) ? r.cp(0x64b, 0x652) : ""))); break;
      case 5: parts.push(r.times(r.int(1, 5), () => r.cp(0x5d0, 0x5ea) + (r.chance(0.5) ? r.cp(0x5b0, 0x5bc) : ""))); break;
      case 6: parts.push(r.times(r.int(1, 5), () => r.cp(0xe01, 0xe2e) + (r.chance(0.4) ? r.pick(["ั", "ี", "่", "้", "็"]) : ""))); break;
      default: parts.push(r.times(r.int(1, 3), () => r.cp(0x1100, 0x1112) + r.cp(0x1161, 0x1175) + (r.chance(0.5) ? r.cp(0x11a8, 0x11c2) : "")));
    }
  }
  return parts.join(r.pick(["", " ", " ", "\n"]));
}

const spaces = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u202f", "\u2003", "\u000b", "\u000c", "\u2028"];

export function whitespace(r) {
  const parts = [];
  if (r.chance(0.3)) parts.push(r.times(r.int(1, 6), () => r.pick(spaces)));
  for (let i = r.int(1, 5); i > 0; --i) {
    parts.push(r.chance(0.5) ? r.pick(words) : r.pick(["x", "1", "!", "—", "é", "中"]));
    const run = r.int(0, 3);
    if (run === 0) parts.push(" ".repeat(r.int(1, 40)));
    else if (run === 1) parts.push(r.times(r.int(1, 8), () => r.pick(["\t", "\n", " "])));
    else if (run === 2) parts.push(r.times(r.int(1, 5), () => r.pick(spaces)));
    else parts.push("\n".repeat(r.int(1, 5)) + " ".repeat(r.int(0, 8)));
  }
  if (r.chance(0.4)) parts.pop(); // sometimes trailing whitespace, sometimes not
  return parts.join("");
}

export function numbers(r) {
  const parts = [];
  for (let i = r.int(1, 5); i > 0; --i) {
    switch (r.int(0, 8)) {
      case 0: parts.push(r.times(r.int(1, 30), () => String(r.int(0, 9)))); break;
      case 1: parts.push(`${r.int(0, 99999)}.${r.times(r.int(1, 8), () => String(r.int(0, 9)))}`); break;
      case 2: parts.push(`-${r.int(1, 1e9)}`); break;
      case 3: parts.push(r.int(1, 999999999).toLocaleString("en-US")); break;
      case 4: parts.push(`${r.int(1900, 2100)}-${String(r.int(1, 12)).padStart(2, "0")}-${String(r.int(1, 28)).padStart(2, "0")}`); break;
      case 5: parts.push(`0x${r.int(0, 0xffffff).toString(16)}`); break;
      case 6: parts.push(`${r.int(1, 9)}e-${r.int(1, 30)}`); break;
      case 7: parts.push(r.times(r.int(1, 6), () => r.pick(["٠", "١", "٢", "٣", "０", "１", "９", "²", "³", "½", "Ⅻ", "①", "७", "๓"]))); break;
      default: parts.push(`v${r.int(0, 20)}.${r.int(0, 99)}.${r.int(0, 999)}`);
    }
  }
  return parts.join(r.pick([" ", "", ", ", "\n", "x", "abc"]));
}

export function punctuation(r) {
  const chars = "!?.,;:-_=+*/\\|@#$%^&()[]{}<>~`\"'".split("");
  const parts = [];
  for (let i = r.int(1, 5); i > 0; --i) {
    switch (r.int(0, 4)) {
      case 0: parts.push(r.times(r.int(1, 20), () => r.pick(chars)) + (r.chance(0.3) ? r.pick(["\n", "\r\n", "\n\n"]) : "")); break;
      case 1: parts.push(r.pick(["...", "!!!", "?!", "---", "===", "```", "/**/", "->", "=>", "::", "...\n\n", "***"])); break;
      case 2: parts.push(r.pick(["https://example.com/a/b?c=1&d=2#e", "user@mail.org", "/usr/local/bin", "C:\\Users\\x", "## Title", "- item", "> quote"])); break;
      case 3: parts.push(r.pick(["«", "»", "„", "“", "”", "‘", "’", "—", "–", "•", "…", "†", "§", "¶", "¿", "¡"])); break;
      default: parts.push(r.pick(words));
    }
  }
  return parts.join(r.pick(["", " ", "\n"]));
}

export function randomUnicode(r) {
  // Blocks fully assigned long before Unicode 14.
  const ranges = [[0xa1, 0xff], [0x100, 0x17e], [0x391, 0x3a1], [0x3a3, 0x3c9], [0x410, 0x44f], [0x531, 0x556],
    [0x5d0, 0x5ea], [0x627, 0x64a], [0x915, 0x939], [0xe01, 0xe2e], [0x10d0, 0x10fa], [0x2190, 0x21ff],
    [0x2200, 0x22ff], [0x2500, 0x257f], [0x20a0, 0x20b9], [0x2701, 0x2767], [0x1f600, 0x1f64f], [0x1d400, 0x1d454]];
  return r.times(r.int(1, 24), () => {
    if (r.chance(0.2)) return r.pick([" ", " ", "\n", "a", "1"]);
    const [lo, hi] = r.pick(ranges);
    return r.cp(lo, hi);
  });
}

// Text with the tokenizer's special-token strings in it: alone, adjacent, in a chat template,
// and near misses that must not match.
export function specials(r, names) {
  const parts = [];
  for (let i = r.int(1, 6); i > 0; --i) {
    const name = r.pick(names);
    switch (r.int(0, 4)) {
      case 0: parts.push(name); break;
      case 1: parts.push(name + name); break;
      case 2: parts.push(name.slice(0, r.int(1, name.length - 1))); break; // near miss
      case 3: parts.push(r.pick(["<", "<<", "|", ">"]) + name + r.pick([">", "|>", "", " "])); break;
      default: parts.push(r.pick([prose, code, cjk, emoji])(r));
    }
  }
  return parts.join(r.pick(["", "", " ", "\n", "\n\n"]));
}

// A conversation in the set's chat format: t(role, text, r) writes one turn (r for formats with
// choices of their own, such as harmony's channels).
export function chat(r, t) {
  const turns = [];
  for (let i = r.int(1, 3); i > 0; --i) turns.push(t(r.pick(["system", "user", "assistant"]), r.pick([prose, code, cjk])(r), r));
  return turns.join("");
}

export const generators = { prose, contractionText, code, cjk, emoji, combining, whitespace, numbers, punctuation, randomUnicode };

export const edgeCases = [
  "", " ", "  ", "\n", "\n\n", "\t", "\r\n", "a", "'", "'s", "'S", "''", "\u00a0", "\u3000", " \n ", "   a", "a   ",
  "0", "00", "000", "0000", "12345678901234567890", " 1", "...", "!", "é", "e\u0301", "\u1100\u1161\u11a8",
  "😀", " 😀", "👨‍👩‍👧‍👦", "Hello world", "hello  world", "HELLO WORLD!", "I'm", "I'M", "we'LL", "\t\tx", "x\n\n\ny",
];
