#!/usr/bin/env python3
"""Renders the real chat templates in tests/data/chat/ over a fixed set of conversations and
writes tests/data/chat/goldens.json, the expected outputs anvil's C++ renderers must match byte
for byte (tests/model/chat_template_test.cpp).

Rendering mirrors HF transformers' apply_chat_template(tokenize=False): a Jinja2
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols; raise_exception
and strftime_now as globals; messages, tools=None, documents=None, add_generation_prompt and the
tokenizer's special tokens as variables. Where the real template raises, the golden records the
error instead of an output.

Usage (from the repository root; needs only python3 and jinja2):
    python3 tools/chat/render_goldens.py
"""

import datetime
import json
import pathlib

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "chat"

# file, the family anvil must recognise it as, BOS, EOS, extra template variables.
TEMPLATES = [
    ("chatml.jinja", "chatml", "", "<|im_end|>", {}),
    ("qwen2.5.jinja", "chatml", "", "<|im_end|>", {}),
    ("qwen3.jinja", "qwen3", "", "<|im_end|>", {}),
    ("llama3-lenml.jinja", "llama3", "<|begin_of_text|>", "<|end_of_text|>", {}),
    ("llama3.jinja", "llama3", "<|begin_of_text|>", "<|eot_id|>", {}),
    ("llama3.1.jinja", "llama3", "<|begin_of_text|>", "<|eot_id|>", {}),
    # 3.2 dates its header with strftime_now (today); pin the date as a caller of
    # apply_chat_template(date_string=...) would, so the golden does not change daily.
    ("llama3.2.jinja", "llama3", "<|begin_of_text|>", "<|eot_id|>", {"date_string": "03 Feb 2025"}),
    ("llama2.jinja", "llama2", "<s>", "</s>", {}),
    ("mistral-v0.1.jinja", "mistral", "<s>", "</s>", {}),
    ("mistral-v0.2.jinja", "mistral", "<s>", "</s>", {}),
    ("mistral-v1.jinja", "mistral", "<s>", "</s>", {}),
]

# Real templates of families anvil does not render; it must refuse them.
UNRECOGNISED = ["gemma-it.jinja", "phi-3-mini.jinja", "mistral-nemo.jinja", "firefunction-v2.jinja"]


def conv(*turns):
    return [{"role": role, "content": content} for role, content in turns]


SYSTEM = ("system", "You are a helpful assistant.")
CONVERSATIONS = {
    "single_user": conv(("user", "Hello!")),
    "system_user": conv(SYSTEM, ("user", "What is 2 + 2?")),
    "multi_turn": conv(("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")),
    "system_multi_turn": conv(SYSTEM, ("user", "Hi"), ("assistant", "Hello!"), ("user", "Who are you?")),
    "ends_with_assistant": conv(SYSTEM, ("user", "Say hi."), ("assistant", "Hi.")),
    # llama.cpp's test-chat-template conversation: padded assistant reply.
    "llama_cpp_conversation": conv(
        ("system", "You are a helpful assistant"), ("user", "Hello"), ("assistant", "Hi there"),
        ("user", "Who are you"), ("assistant", "   I am an assistant   "), ("user", "Another question")),
    "newlines_unicode_spaces": conv(
        ("system", "  Be brief.\n\nAnswer in French.  "),
        ("user", "\t Grüße, 世界! 👋\nLine two\n\n"),
        ("assistant", "\u00a0 Bonjour ! \u3000"),
        ("user", " naïve café — “quotes” and 'apostrophes' \\ backslash ")),
    # Python's strip() removes U+2003, U+00A0, U+3000 and U+001F but not U+200B.
    "unicode_whitespace_edges": conv(
        ("user", "\u2003\u00a0\u001fedge\u200b\u3000\n"), ("assistant", "\u200b kept \u2029")),
    "empty_strings": conv(("system", ""), ("user", "")),
    # Qwen3 reasoning: <think> blocks in assistant history.
    "think_history": conv(
        ("user", "What is 1+1?"), ("assistant", "<think>\nAdd them.\n</think>\n\n2"), ("user", "And 2+2?")),
    "think_last_assistant": conv(("user", "What is 1+1?"), ("assistant", "<think>\n\nAdd them.\n\n</think>\n\n\n2\n")),
    "plain_last_assistant": conv(("user", "Hi"), ("assistant", "Hello.")),
    "think_twice": conv(("user", "q"), ("assistant", "<think>a</think>b<think>c</think>\nd")),
    "think_unclosed": conv(("user", "q"), ("assistant", "<think>still thinking")),
    "tool_response_as_user": conv(
        ("user", "Weather in Paris?"), ("assistant", "<think>\nNeed the tool.\n</think>\n\nChecking."),
        ("user", "<tool_response>\nsunny\n</tool_response>")),
    "system_in_middle": conv(("user", "Hi"), ("assistant", "Hello."), ("system", "Be terse."), ("user", "Again")),
    "system_after_user": conv(("user", "Hi"), ("system", "Be terse."), ("user", "Again")),
    "system_only": conv(("system", "You are terse.")),
    "assistant_first": conv(("assistant", "Hello."), ("user", "Hi")),
    "two_users": conv(("user", "One"), ("user", "Two")),
    "empty": [],
    "tool_role": conv(("user", "Weather?"), ("tool", "sunny")),
    "unknown_role": conv(("user", "Hi"), ("narrator", "Meanwhile...")),
}


def make_environment():
    """The environment transformers compiles chat templates in."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_all(env, source, bos, eos, variables):
    template = env.from_string(source)
    renders = []
    for name, messages in CONVERSATIONS.items():
        for add_generation_prompt in (False, True):
            case = {"conversation": name, "add_generation_prompt": add_generation_prompt}
            try:
                case["output"] = template.render(
                    messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
                    bos_token=bos, eos_token=eos, **variables)
            except jinja2.exceptions.TemplateError as e:
                case["error"] = f"{type(e).__name__}: {e}"
            renders.append(case)
    return renders


def main():
    env = make_environment()
    templates = []
    for file, family, bos, eos, variables in TEMPLATES:
        source = (DATA / file).read_text(encoding="utf-8")
        templates.append({"file": file, "family": family, "bos_token": bos, "eos_token": eos,
                          "variables": variables, "renders": render_all(env, source, bos, eos, variables)})
    goldens = {
        "generator": "tools/chat/render_goldens.py",
        "renderer": f"jinja2 {jinja2.__version__} ImmutableSandboxedEnvironment(trim_blocks=True, "
                    "lstrip_blocks=True, extensions=[loopcontrols]), as transformers' apply_chat_template",
        "conversations": CONVERSATIONS,
        "templates": templates,
        "unrecognised": UNRECOGNISED,
    }
    out = DATA / "goldens.json"
    out.write_text(json.dumps(goldens, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} ({len(templates)} templates x {len(CONVERSATIONS)} conversations x 2)")


if __name__ == "__main__":
    main()
