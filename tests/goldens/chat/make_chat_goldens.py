#!/usr/bin/env python3
"""Chat-template goldens for python/tests/test_chat.py: what transformers' own renderer
(`transformers.utils.chat_template_utils.render_jinja_template`, the function apply_chat_template
calls) writes for the real chat templates of the families moekit runs, from llama.cpp's copies of
them (`models/templates/*.jinja` of the llama.cpp tree inside llama-cpp-python's sdist).

    python3 tests/goldens/chat/make_chat_goldens.py --templates <llama.cpp>/models/templates

writes chat_goldens.json: per template its text and, per case (messages, add_generation_prompt,
tools, keyword variables), the rendered text or the error transformers raised. The keyword
variables always include bos_token "<BOS>", eos_token "<EOS>" and date_string "26 Jul 2024", and the
clock templates read through strftime_now (gpt-oss, Mistral) is held at 2024-07-26 12:00 (FIXED_NOW: the
test holds moekit's there too), so no rendering depends on the day it was made. Made with
transformers 5.25.0 and jinja2 3.1.6; CI never runs this.
"""
import argparse
import json
from datetime import datetime
from pathlib import Path

TEMPLATES = [
    "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "Qwen3-Coder", "Kimi-K2-Instruct", "Kimi-K2-Thinking", "moonshotai-Kimi-K2",
    "deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.2", "GLM-4.6", "GLM-4.7-Flash", "MiniMax-M2",
    "openai-gpt-oss-120b", "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct", "Mistral-Small-3.2-24B-Instruct-2506", "mistralai-Mistral-Nemo-Instruct-2407",
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}

CASES = [
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4."},
                  {"role": "user", "content": "Und 3+3? Ünïcödé ✓ 中文"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Why?"},
                  {"role": "assistant", "content": "Because.", "reasoning_content": "Let me think.\nShort."}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "Hello"}], "add_generation_prompt": True,
     "kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                      "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"}],
     "add_generation_prompt": True, "tools": [WEATHER]},
    {"messages": [{"role": "assistant", "content": "no user first"}], "add_generation_prompt": False},
]

FIXED = {"bos_token": "<BOS>", "eos_token": "<EOS>", "date_string": "26 Jul 2024"}
FIXED_NOW = datetime(2024, 7, 26, 12, 0, 0)


class FixedClock(datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", type=Path, required=True)
    args = ap.parse_args()
    import jinja2
    import transformers
    import transformers.utils.chat_template_utils as ctu
    from transformers.utils.chat_template_utils import render_jinja_template

    ctu.datetime = FixedClock  # strftime_now reads the module's datetime when it runs
    out = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "fixed_kwargs": FIXED,
           "fixed_now": FIXED_NOW.isoformat(), "templates": []}
    for name in TEMPLATES:
        text = (args.templates / f"{name}.jinja").read_text(encoding="utf-8")
        cases = []
        for case in CASES:
            kwargs = {**FIXED, **case.get("kwargs", {})}
            entry = {"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"],
                     "tools": case.get("tools"), "kwargs": kwargs}
            try:
                rendered, _ = render_jinja_template(
                    conversations=[json.loads(json.dumps(case["messages"]))], tools=case.get("tools"),
                    chat_template=text, add_generation_prompt=case["add_generation_prompt"], **kwargs)
                entry["rendered"] = rendered[0]
            except Exception as e:  # noqa: BLE001 - the reference's own failure is the golden
                entry["error"] = f"{type(e).__name__}: {e}"
            cases.append(entry)
        out["templates"].append({"name": name, "template": text, "cases": cases})
        print(name, sum("rendered" in c for c in cases), "rendered,", sum("error" in c for c in cases), "errors")
    (Path(__file__).parent / "chat_goldens.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n",
                                                            encoding="utf-8")


if __name__ == "__main__":
    main()
