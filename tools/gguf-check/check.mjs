// Reads a GGUF file with Hugging Face's GGUF parser (an implementation independent of anvil's)
// and compares everything it sees with `anvil inspect --json` of the same file: every metadata
// key and value, every tensor's name, type, shape and offset.
// Usage: node check.mjs FILE.gguf ANVIL_INSPECT.json
import { readFileSync } from "node:fs";
import { gguf } from "@huggingface/gguf";

const [file, anvilJson] = process.argv.slice(2);
if (!file || !anvilJson) {
  console.error("usage: node check.mjs FILE.gguf ANVIL_INSPECT.json");
  process.exit(2);
}
const ours = JSON.parse(readFileSync(anvilJson, "utf8"));
const { metadata, tensorInfos, tensorDataOffset } = await gguf(file, { allowLocalFile: true });

const errors = [];
const norm = (v) => (typeof v === "bigint" ? Number(v) : Array.isArray(v) ? v.map(norm) : v);
const same = (a, b) => {
  if (typeof a === "number" && typeof b === "number") return a === b || Math.abs(a - b) <= 1e-6 * Math.abs(b);
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => same(x, b[i]));
  return a === b;
};

if (Number(metadata.version) !== ours.version) errors.push(`version ${metadata.version} vs ${ours.version}`);
if (Number(metadata.tensor_count) !== ours.tensors.length) errors.push(`tensor_count ${metadata.tensor_count} vs ${ours.tensors.length}`);
const theirKeys = Object.keys(metadata).filter((k) => !["version", "tensor_count", "kv_count"].includes(k));
if (Number(metadata.kv_count) !== Object.keys(ours.metadata).length) errors.push(`kv_count ${metadata.kv_count} vs ${Object.keys(ours.metadata).length}`);
for (const key of theirKeys) {
  if (!(key in ours.metadata)) errors.push(`metadata ${key}: only the HF parser sees it`);
  else if (!same(norm(metadata[key]), ours.metadata[key])) errors.push(`metadata ${key}: values differ`);
}
for (const key of Object.keys(ours.metadata)) if (!(key in metadata)) errors.push(`metadata ${key}: the HF parser does not see it`);

tensorInfos.forEach((t, i) => {
  const o = ours.tensors[i];
  if (!o) return;
  if (t.name !== o.name) errors.push(`tensor ${i}: name ${t.name} vs ${o.name}`);
  if (Number(t.dtype) !== o.type_id) errors.push(`tensor ${t.name}: type ${t.dtype} vs ${o.type_id}`);
  if (!same(t.shape.map(Number), o.shape)) errors.push(`tensor ${t.name}: shape ${t.shape} vs ${o.shape}`);
  if (Number(t.offset) !== o.offset) errors.push(`tensor ${t.name}: offset ${t.offset} vs ${o.offset}`);
});

if (errors.length) {
  console.error(`${file}: ${errors.length} differences\n  ` + errors.slice(0, 20).join("\n  "));
  process.exit(1);
}
console.log(`${file}: the HF GGUF parser agrees (${theirKeys.length} metadata keys, ${tensorInfos.length} tensors, data at ${tensorDataOffset})`);
