// Writes the tokenizer goldens in tests/data/tokenizer/ with transformers.js's tokenizer
// (@lenml/tokenizers, a packaging of it), reading the same tokenizer.json / tokenizer_config.json
// files the C++ test reads (tests/data/tokenizers/, fetched by scripts/fetch-tokenizers.sh).
//
//   scripts/fetch-tokenizers.sh && cd tools/tokenizer && npm ci && node gen_goldens.mjs
//
// <name>.jsonl, one line per string: {"text": ..., "ids": [...]} — ids encoded without BOS/EOS,
// with special-token strings recognised (parse_special). "plain": [...] is added where encoding
// with control tokens NOT recognised gives different ids. nfc.jsonl: {"text", "nfc"} pairs from
// String.prototype.normalize("NFC"), for the NFC implementation the Qwen2 tokenizer needs.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";
import { rng, generators, edgeCases, specials, chat, combining, randomUnicode } from "./texts.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const outDir = path.join(root, "tests/data/tokenizer");

// gpt-oss's harmony format: <|start|>role[<|channel|>channel]<|message|>text, then <|end|>; the
// assistant's final answer ends with <|return|>, a tool call (with <|constrain|>) with <|call|>.
function harmonyTurn(role, text, r) {
  if (role !== "assistant") return `<|start|>${role}<|message|>${text}<|end|>`;
  switch (r.int(0, 2)) {
    case 0: return `<|start|>assistant<|channel|>analysis<|message|>${text}<|end|>`;
    case 1: return `<|start|>assistant<|channel|>final<|message|>${text}<|return|>`;
    default: {
      const fn = r.pick(["get_weather", "search", "run_code"]);
      return `<|start|>assistant<|channel|>commentary to=functions.${fn} <|constrain|>json<|message|>` +
        `${JSON.stringify({ query: text.slice(0, 60) })}<|call|>`;
    }
  }
}

// Strings aimed at o200k's regex: case runs inside words, contractions glued to their word in any
// case, titlecase (Lt), modifier (Lm) and other (Lo) letters and marks, '/' after punctuation.
const gptossEdgeCases = [
  "camelCaseWord", "HTTPServer", "iPhone", "XMLHttpRequest", "ABCdef", "aBcD", "DON'T", "don'T", "McDonald's",
  "O'NEIL'S", "we'VE", "it'd've", "ǅemal ǈj", "ʰello ʷorld", "日本語abc", "éÉe\u0301E\u0301", "a/b", "x !/\n/y",
  "https://a.b/c/", "...//\n\n", "1234567", " 12 345", "<|start|>user<|message|>Hi<|end|>",
  "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>",
  "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Tokyo\"}<|call|>",
];

// Strings aimed at tekken's regex: o200k's case runs without its contractions, single digits, '/'
// after punctuation; its control tokens in context.
const tekkenEdgeCases = [
  "camelCaseWord", "HTTPServer", "DON'T", "don't", "McDonald's", "we'VE", "ǅemal ǈj", "a/b", "x !/\n/y",
  "1234567", " 12 345", "<s>[INST]Hi[/INST]Hello!</s>", "[AVAILABLE_TOOLS][{\"type\": \"function\"}][/AVAILABLE_TOOLS]",
  "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]</s>", "[PREFIX]def f(x):[SUFFIX]    return y[MIDDLE]",
];

const sets = [
  { name: "qwen3", seed: 1, count: 2000, turn: (role, text) => `<|im_start|>${role}\n${text}<|im_end|>\n` },
  { name: "llama3", seed: 2, count: 2000, turn: (role, text) => `<|start_header_id|>${role}<|end_header_id|>\n\n${text}<|eot_id|>` },
  { name: "llama2", seed: 3, count: 1500, turn: (role, text) => `<s>[INST] ${role}: ${text} [/INST]</s>` },
  { name: "gptoss", seed: 5, count: 2000, turn: harmonyTurn, extra: gptossEdgeCases },
  { name: "gemma3", seed: 6, count: 1500, turn: (role, text) => `<start_of_turn>${role}\n${text}<end_of_turn>\n` },
  // Mistral NeMo's tekken vocabulary (also Mistral Small 3.x's): [INST] turns, tool calls, FIM.
  { name: "mistral_nemo", seed: 7, count: 2000, extra: tekkenEdgeCases,
    turn: (role, text) => (role === "user" ? `[INST]${text}[/INST]` : `${text}</s>`) },
];

// The same rule as llama.cpp's converter and model/tokenizer/tokenizer_json.cpp: added tokens that are
// special, or look special, become control tokens; the others user-defined tokens.
function looksSpecial(t) {
  return ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(t) || (t.startsWith("<|") && t.endsWith("|>")) ||
    (t.startsWith("<｜") && t.endsWith("｜>")) || (t.startsWith("<unused") && t.endsWith(">"));
}

function load(name) {
  const dir = path.join(root, "tests/data/tokenizers", name);
  const file = (f) => {
    const p = path.join(dir, f);
    if (!fs.existsSync(p)) throw new Error(`${p} missing: run scripts/fetch-tokenizers.sh first`);
    return JSON.parse(fs.readFileSync(p, "utf8"));
  };
  const tokenizerJSON = file("tokenizer.json");
  const tokenizerConfig = file("tokenizer_config.json");
  const full = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  // parse_special = false: only user-defined added tokens are still split out of the text.
  const userDefined = tokenizerJSON.added_tokens.filter((t) => !t.special && !looksSpecial(t.content));
  const plain = TokenizerLoader.fromPreTrained({ tokenizerJSON: { ...tokenizerJSON, added_tokens: userDefined }, tokenizerConfig });
  // Strings to embed in text: every added token, but only one of the reserved ones (Llama 3 has
  // 250, gpt-oss 12).
  const reserved = /^(<\|reserved_(special_token_)?\d+\|>|<SPECIAL_\d+>)$/;
  const specialNames = tokenizerJSON.added_tokens.map((t) => t.content)
    .filter((c) => !reserved.test(c) || ["<|reserved_special_token_7|>", "<|reserved_200000|>", "<SPECIAL_20>"].includes(c));
  return { full, plain, specialNames };
}

function texts(set, specialNames) {
  const r = rng(set.seed);
  const out = [...edgeCases, ...(set.extra ?? [])];
  const kinds = Object.values(generators);
  while (out.length < set.count) {
    const roll = r.next();
    if (roll < 0.12) out.push(specials(r, specialNames));
    else if (roll < 0.16) out.push(chat(r, set.turn));
    else if (roll < 0.24) out.push(Array.from({ length: r.int(2, 4) }, () => r.pick(kinds)(r)).join(r.pick(["", " ", "\n"])));
    else if (roll < 0.245) out.push(Array.from({ length: r.int(10, 25) }, () => r.pick(kinds)(r)).join(r.pick([" ", "\n", "\n\n"])));
    else out.push(r.pick(kinds)(r));
  }
  return out;
}

function writeGoldens(set) {
  const { full, plain, specialNames } = load(set.name);
  const lines = [];
  let withPlain = 0;
  for (const text of texts(set, specialNames)) {
    const ids = full.encode(text, { add_special_tokens: false });
    const record = { text, ids };
    const plainIds = plain.encode(text, { add_special_tokens: false });
    if (JSON.stringify(plainIds) !== JSON.stringify(ids)) {
      record.plain = plainIds;
      ++withPlain;
    }
    lines.push(JSON.stringify(record));
  }
  const file = path.join(outDir, `${set.name}.jsonl`);
  fs.writeFileSync(file, lines.join("\n") + "\n");
  console.log(`${file}: ${lines.length} strings (${withPlain} with "plain"), ${fs.statSync(file).size} bytes`);
}

function writeNfc() {
  const r = rng(4);
  const lines = [];
  for (let i = 0; i < 600; ++i) {
    const text = r.chance(0.7) ? combining(r) : randomUnicode(r).normalize(r.pick(["NFD", "NFC", "NFKD"]));
    lines.push(JSON.stringify({ text, nfc: text.normalize("NFC") }));
  }
  const file = path.join(outDir, "nfc.jsonl");
  fs.writeFileSync(file, lines.join("\n") + "\n");
  console.log(`${file}: ${lines.length} strings, ${fs.statSync(file).size} bytes`);
}

// Arguments: the sets to write (default: all, and nfc.jsonl).
const only = process.argv.slice(2);
fs.mkdirSync(outDir, { recursive: true });
for (const set of sets) if (only.length === 0 || only.includes(set.name)) writeGoldens(set);
if (only.length === 0 || only.includes("nfc")) writeNfc();
