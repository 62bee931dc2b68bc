#!/usr/bin/env python3
"""Renders the real chat templates in tests/data/chat/ over a fixed set of conversations and
writes tests/data/chat/goldens.json, the expected outputs anvil's C++ Jinja interpreter must match
byte for byte (tests/model/chat_template_test.cpp).

Rendering mirrors HF transformers' apply_chat_template(tokenize=False): a Jinja2
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols; a tojson filter
that keeps non-ASCII; raise_exception and strftime_now as globals; messages, tools, documents=None,
add_generation_prompt, the tokenizer's special tokens and any extra template variables as
variables. Where the real template raises (raise_exception, or an error such as TypeError or
UndefinedError), the golden records the error instead of an output.

strftime_now reads a fixed clock, FIXED_NOW (2025-02-03 12:00:00), so the goldens do not change
from day to day; the C++ test gives anvil the same clock.

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

# The clock strftime_now reads (templates such as Llama 3.2, Mistral Small 3.2 and gpt-oss date
# their system prompt with it).
FIXED_NOW = datetime.datetime(2025, 2, 3, 12, 0, 0)

# ---------------------------------------------------------------------------------------------
# Tools, in the OpenAI / transformers shape.

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                             "description": "The temperature unit", "default": "celsius"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_hotel",
            "description": "Book a hotel room for a group of guests.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "Where to stay"},
                    "nights": {"type": "integer", "description": "How many nights"},
                    "max_price": {"type": "number", "description": "Highest price per night, in euros"},
                    "guests": {
                        "type": "array",
                        "description": "Who is staying",
                        "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                            "required": ["name"],
                        },
                    },
                },
                "required": ["city", "nights", "guests"],
            },
        },
    },
]


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def conv(*turns, tools=None):
    """A conversation: role/content pairs, or whole message dicts."""
    messages = [t if isinstance(t, dict) else {"role": t[0], "content": t[1]} for t in turns]
    return {"messages": messages, "tools": tools}


SYSTEM = ("system", "You are a helpful assistant.")
PARIS = {"city": "Paris", "unit": "celsius"}
WEATHER_Q = ("user", "What's the weather like in Paris?")
WEATHER_A = ("assistant", "It is 21 °C in Paris.")


def roundtrip(call_id, arguments=PARIS, content=""):
    """user asks, the assistant calls get_weather, the tool answers, the assistant answers."""
    return [
        WEATHER_Q,
        {"role": "assistant", "content": content, "tool_calls": [call(call_id, "get_weather", arguments)]},
        {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": "{\"temp\": 21}"},
        WEATHER_A,
    ]


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
    "empty": conv(),
    "tool_role": conv(("user", "Weather?"), ("tool", "sunny")),
    "unknown_role": conv(("user", "Hi"), ("narrator", "Meanwhile...")),
    # Reasoning kept in a separate field, as Qwen3 / DeepSeek servers pass it back.
    "reasoning_content_history": conv(
        ("user", "What is 1+1?"),
        {"role": "assistant", "content": "2", "reasoning_content": "1 plus 1 is 2."},
        ("user", "And 2+2?")),
    # gpt-oss names the same field "thinking".
    "thinking_field": conv(
        ("user", "What is 1+1?"), {"role": "assistant", "content": "2", "thinking": "1 plus 1 is 2."}),
    # --- Tool use ---
    "tools_user": conv(WEATHER_Q, tools=TOOLS),
    "tools_system_user": conv(SYSTEM, WEATHER_Q, tools=TOOLS),
    "tool_call_roundtrip": conv(*roundtrip("call_1"), tools=TOOLS),
    # Mistral templates require 9-character alphanumeric tool call ids.
    "tool_call_roundtrip_id9": conv(*roundtrip("abc123XYZ"), tools=TOOLS),
    # The tool-calling assistant message with content None (DeepSeek renders tool calls only then).
    "tool_call_content_none": conv(*roundtrip("abc123XYZ", content=None), tools=TOOLS),
    # Arguments as the JSON string the OpenAI API carries, not a dict.
    "tool_call_string_arguments": conv(*roundtrip("abc123XYZ", arguments=json.dumps(PARIS)), tools=TOOLS),
    "tool_call_string_arguments_content_none": conv(
        *roundtrip("abc123XYZ", arguments=json.dumps(PARIS), content=None), tools=TOOLS),
    "two_tool_calls_parallel": conv(
        ("user", "What's the weather in Paris and in London?"),
        {"role": "assistant", "content": "", "tool_calls": [
            call("abc123XYZ", "get_weather", PARIS),
            call("def456UVW", "get_weather", {"city": "London", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "def456UVW", "name": "get_weather", "content": "{\"temp\": 15}"},
        ("assistant", "Paris: 21 °C. London: 15 °C."),
        tools=TOOLS),
    # A tool call whose arguments hold an array of objects and a number.
    "tool_call_nested_arguments": conv(
        ("user", "Book two nights in Rome for Ann and Bob, under 120.5 euros."),
        {"role": "assistant", "content": "", "tool_calls": [call("ghi789RST", "book_hotel", {
            "city": "Rome", "nights": 2, "max_price": 120.5,
            "guests": [{"name": "Ann", "age": 34}, {"name": "Bob"}]})]},
        tools=TOOLS),
    # Tool calls in the history, but no tools offered for this request.
    "tool_call_no_tools_list": conv(*roundtrip("abc123XYZ")),
    # Non-ASCII in the user turn, the tool arguments and the tool result.
    "tool_args_non_ascii": conv(
        ("user", "Quel temps fait-il à Zürich et à 北京 ?"),
        {"role": "assistant", "content": "", "tool_calls": [
            call("jkl012MNO", "get_weather", {"city": "Zürich", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "jkl012MNO", "name": "get_weather",
         "content": "{\"temp\": 18, \"desc\": \"ensoleillé ☀\"}"},
        ("assistant", "À Zürich il fait 18 °C, ensoleillé ☀."),
        tools=TOOLS),
    # Reasoning in a tool loop after the last user query (Qwen3 keeps it there).
    "reasoning_content_tool_loop": conv(
        WEATHER_Q,
        {"role": "assistant", "content": "", "reasoning_content": "I need the weather tool.",
         "tool_calls": [call("abc123XYZ", "get_weather", PARIS)]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 °C in Paris.", "reasoning_content": "The tool says 21."},
        tools=TOOLS),
}

# ---------------------------------------------------------------------------------------------
# Templates: name, file, BOS, EOS (as each model's tokenizer_config.json sets them), extra
# template variables.

# firefunction-v2 reads the function specs and the date from these two variables.
FIREFUNCTION_VARIABLES = {
    "functions": json.dumps([t["function"] for t in TOOLS], indent=4, ensure_ascii=False),
    "datetime": "2025-02-03 12:00",
}

TEMPLATES = [
    ("chatml", "chatml.jinja", "", "<|im_end|>", {}),
    ("qwen2.5", "qwen2.5.jinja", "", "<|im_end|>", {}),
    ("qwen3", "qwen3.jinja", "", "<|im_end|>", {}),
    ("qwen3-no-thinking", "qwen3.jinja", "", "<|im_end|>", {"enable_thinking": False}),
    ("qwen3-thinking-2507", "qwen3-thinking-2507.jinja", "", "<|im_end|>", {}),
    ("deepseek-r1-distill", "deepseek-r1-distill.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", {}),
    ("deepseek-v3", "deepseek-v3.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", {}),
    ("llama3-lenml", "llama3-lenml.jinja", "<|begin_of_text|>", "<|end_of_text|>", {}),
    ("llama3", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>", {}),
    # llama3.1.jinja is also Llama 3.3's template; date_string as apply_chat_template(date_string=).
    ("llama3.1", "llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>", {"date_string": "03 Feb 2025"}),
    # No date_string: 3.2 dates its header with strftime_now, i.e. FIXED_NOW.
    ("llama3.2", "llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>", {}),
    ("llama2", "llama2.jinja", "<s>", "</s>", {}),
    ("mistral-v0.1", "mistral-v0.1.jinja", "<s>", "</s>", {}),
    ("mistral-v0.2", "mistral-v0.2.jinja", "<s>", "</s>", {}),
    ("mistral-v1", "mistral-v1.jinja", "<s>", "</s>", {}),
    ("mistral-nemo", "mistral-nemo.jinja", "<s>", "</s>", {}),
    ("mistral-small-3.2", "mistral-small-3.2.jinja", "<s>", "</s>", {}),
    ("gemma-it", "gemma-it.jinja", "<bos>", "<eos>", {}),
    ("gemma3", "gemma3.jinja", "<bos>", "<end_of_turn>", {}),
    ("phi-3-mini", "phi-3-mini.jinja", "<s>", "<|endoftext|>", {}),
    ("phi-3.5-mini", "phi-3.5-mini.jinja", "<s>", "<|endoftext|>", {}),
    ("phi-4", "phi-4.jinja", "<|endoftext|>", "<|im_end|>", {}),
    ("hermes3-tool-use", "hermes3-tool-use.jinja", "<|begin_of_text|>", "<|im_end|>", {}),
    ("firefunction-v2", "firefunction-v2.jinja", "<|begin_of_text|>", "<|eot_id|>", FIREFUNCTION_VARIABLES),
    ("gpt-oss", "gpt-oss.jinja", "<|startoftext|>", "<|return|>", {}),
]


def make_environment():
    """The environment transformers compiles chat templates in."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_all(env, source, bos, eos, variables):
    template = env.from_string(source)
    renders = []
    for name, conversation in CONVERSATIONS.items():
        for add_generation_prompt in (False, True):
            case = {"conversation": name, "add_generation_prompt": add_generation_prompt}
            try:
                case["output"] = template.render(
                    messages=conversation["messages"], tools=conversation["tools"], documents=None,
                    add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos, **variables)
            except Exception as e:  # what apply_chat_template would raise
                case["error"] = f"{type(e).__name__}: {e}"
            renders.append(case)
    return renders


def main():
    env = make_environment()
    templates = []
    for name, file, bos, eos, variables in TEMPLATES:
        source = (DATA / file).read_text(encoding="utf-8")
        templates.append({"name": name, "file": file, "bos_token": bos, "eos_token": eos, "variables": variables,
                          "renders": render_all(env, source, bos, eos, variables)})
    goldens = {
        "generator": "tools/chat/render_goldens.py",
        "renderer": f"jinja2 {jinja2.__version__} ImmutableSandboxedEnvironment(trim_blocks=True, "
                    "lstrip_blocks=True, extensions=[loopcontrols]), as transformers' apply_chat_template",
        "now": FIXED_NOW.isoformat(),
        "conversations": CONVERSATIONS,
        "templates": templates,
    }
    out = DATA / "goldens.json"
    out.write_text(json.dumps(goldens, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} ({len(templates)} templates x {len(CONVERSATIONS)} conversations x 2)")


if __name__ == "__main__":
    main()
