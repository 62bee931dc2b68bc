#!/usr/bin/env python3
"""Trains anvil's default model (llama_model.py) on the corpus of make_corpus.py with the tokenizer
of train_tokenizer.py, within a wall-clock budget.

Usage: python3 train.py CORPUS_DIR TOKENIZER_JSON OUT_DIR [--minutes 5.5] [--epochs 30] [--dim 384 ...]

Data: every document becomes BOS + tokens + EOS, concatenated into one stream; a batch is `batch`
random windows of context_length + 1 tokens. Held-out loss is the mean over fixed, non-overlapping
windows of heldout.txt's stream. AdamW (weight decay on matrices only), linear warm-up then cosine
decay to lr/10, where progress is the largest of: time spent / --minutes, tokens seen / (--epochs x
the training tokens), steps done / --max-steps; training stops when progress reaches 1. bf16
autocast on the GPU. With ~1.5M training tokens a model this size overfits if it trains too many
epochs, so the model saved is the one with the lowest held-out loss seen (evaluated every
--eval-every steps and at the end); train.json keeps the whole curve.

Writes OUT_DIR/model.pt ({"config", "state_dict" (float32), "tokenizer"}) and OUT_DIR/train.json
(settings, losses, timings, samples). Prints the loss as it goes and greedy and sampled
continuations at the end.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import Llama, config  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402

PROMPTS = ["And God said", "In the beginning", "The LORD is my shepherd", "A fool and his money"]


def token_stream(tok, path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in f.read().split("\n\n") if d.strip()]
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64), len(docs)


def lr_at(progress, step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


@torch.no_grad()
def evaluate(model, windows, a, device):
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(windows), a.batch):
        w = windows[i:i + a.batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
        total += loss.item()
        n += w[:, 1:].numel()
    model.train()
    return total / n


@torch.no_grad()
def generate(model, tok, prompt, n, device, temperature=0.0, gen=None):
    model.eval()
    ids = [tok.token_to_id("<|begin_of_text|>")] + tok.encode(prompt, add_special_tokens=False).ids
    out = []
    for _ in range(n):
        ctx = torch.tensor([ids[-model.cfg.context_length:]], device=device)
        logits = model(ctx)[0, -1].float()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
        if nxt == tok.token_to_id("<|end_of_text|>"):
            break
        ids.append(nxt)
        out.append(nxt)
    model.train()
    return prompt + tok.decode(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=5.5, help="training-loop wall-clock budget")
    ap.add_argument("--epochs", type=float, default=30, help="schedule length in passes over the training tokens (0: none)")
    ap.add_argument("--max-steps", type=int, default=0, help="schedule length in steps (0: none)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-windows", type=int, default=256, help="held-out windows per evaluation (at most)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (costs a minute up front)")
    a = ap.parse_args()
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    tok = Tokenizer.from_file(a.tokenizer)
    train_ids, n_train_docs = token_stream(tok, os.path.join(a.corpus, "train.txt"))
    held_ids, n_held_docs = token_stream(tok, os.path.join(a.corpus, "heldout.txt"))
    n_win = min(a.eval_windows, (len(held_ids) - 1) // a.ctx)
    held_windows = torch.stack([held_ids[i * a.ctx:i * a.ctx + a.ctx + 1] for i in range(n_win)])
    train_gpu = train_ids.to(device)
    print(f"data: {n_train_docs} train documents, {len(train_ids)} tokens; {n_held_docs} held-out documents, "
          f"{len(held_ids)} tokens ({n_win} eval windows); prep {time.time() - t_start:.1f}s", flush=True)

    cfg = config(vocab_size=tok.get_vocab_size(), context_length=a.ctx, dim=a.dim, n_layers=a.layers, n_heads=a.heads,
                 n_kv_heads=a.kv_heads, ffn_dim=a.ffn, dropout=a.dropout)
    model = Llama(cfg)
    model.init_weights(a.seed)
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, {json.dumps(cfg.to_dict())}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if device.type == "cuda" else {}))
    step_fn = torch.compile(model) if a.compile else model

    gen = torch.Generator(device=device).manual_seed(a.seed)
    budget_s = a.minutes * 60
    log, best = [], {"loss": float("inf"), "step": -1, "state": None}
    t0, step, tokens_seen, loss_ema = time.time(), 0, 0, None

    def checkpoint_if_best(step, train_loss):
        held = evaluate(model, held_windows, a, device)
        entry = {"step": step, "seconds": round(time.time() - t0, 1), "train_loss": train_loss, "heldout_loss": held}
        log.append(entry)
        mark = ""
        if held < best["loss"]:
            best.update(loss=held, step=step, state={k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()})
            mark = " *"
        print(f"step {step:5d}  {entry['seconds']:6.1f}s  train {train_loss:.4f}  held-out {held:.4f}{mark}", flush=True)

    while True:
        elapsed = time.time() - t0
        progress = max(elapsed / budget_s, step / a.max_steps if a.max_steps else 0.0,
                       tokens_seen / (a.epochs * len(train_ids)) if a.epochs else 0.0)
        if progress >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(progress, step, a)
        starts = torch.randint(0, len(train_gpu) - a.ctx - 1, (a.batch,), device=device, generator=gen)
        w = train_gpu[starts[:, None] + torch.arange(a.ctx + 1, device=device)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = step_fn(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += w[:, 1:].numel()
        if step % 25 == 0 or step == 1:
            v = loss.item()
            loss_ema = v if loss_ema is None else 0.8 * loss_ema + 0.2 * v
        if step % a.eval_every == 0:
            checkpoint_if_best(step, loss_ema)
    train_seconds = time.time() - t0
    checkpoint_if_best(step, loss_ema)

    model.load_state_dict(best["state"])
    print(f"trained {step} steps, {tokens_seen / 1e6:.1f}M tokens ({tokens_seen / len(train_ids):.1f} epochs) in "
          f"{train_seconds:.0f}s ({tokens_seen / train_seconds / 1e3:.0f}k tokens/s); keeping step {best['step']} "
          f"(held-out loss {best['loss']:.4f})", flush=True)
    final_train = evaluate(model, torch.stack([train_ids[i * a.ctx:i * a.ctx + a.ctx + 1] for i in range(n_win)]), a, device)

    samples = {}
    sample_gen = torch.Generator(device=device).manual_seed(a.seed)
    for p in PROMPTS:
        samples[p] = {"greedy": generate(model, tok, p, 48, device),
                      "temperature_0.8": generate(model, tok, p, 48, device, 0.8, sample_gen)}
        print(f"--- {p!r}\n  greedy: {samples[p]['greedy']!r}\n  t=0.8:  {samples[p]['temperature_0.8']!r}")

    state = {k: v.float().cpu().contiguous() for k, v in best["state"].items()}
    torch.save({"config": cfg.to_dict(), "state_dict": state, "tokenizer": os.path.basename(a.tokenizer)},
               os.path.join(a.out, "model.pt"))
    summary = {"settings": vars(a), "config": cfg.to_dict(), "parameters": n_params, "steps": step,
               "tokens_seen": tokens_seen, "epochs": tokens_seen / len(train_ids), "train_tokens": len(train_ids),
               "heldout_tokens": len(held_ids), "train_seconds": train_seconds, "total_seconds": time.time() - t_start,
               "best_step": best["step"], "final_heldout_loss": best["loss"], "final_train_loss": final_train,
               "log": log, "samples": samples, "torch": torch.__version__,
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"held-out loss {best['loss']:.4f} (ppl {math.exp(best['loss']):.2f}), train loss {final_train:.4f}; "
          f"wrote {a.out}/model.pt and train.json; {time.time() - t_start:.0f}s in all")


if __name__ == "__main__":
    main()
