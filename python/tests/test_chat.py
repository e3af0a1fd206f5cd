"""moekit.chat: the real chat templates of the families moekit runs (llama.cpp's copies: Qwen3, Qwen3.5,
Qwen3-Coder, Kimi-K2, DeepSeek-V3.1 / V3.2, GLM-4.6 / 4.7-Flash, MiniMax-M2, gpt-oss, Llama-3.x, Mistral)
rendered byte for byte as transformers' apply_chat_template renders them, and the templates' own errors
raised where transformers raised (tests/goldens/chat, make_chat_goldens.py)."""

import json
import pathlib
from datetime import datetime

import pytest

jinja2 = pytest.importorskip("jinja2", reason="moekit.chat needs jinja2 (scripts/setup.sh installs it into .venv)")

from moekit import chat  # noqa: E402

GOLDENS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "tests" / "goldens" / "chat" /
                      "chat_goldens.json").read_text(encoding="utf-8"))
CASES = [(t["name"], i) for t in GOLDENS["templates"] for i in range(len(t["cases"]))]


class FixedClock(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.fromisoformat(GOLDENS["fixed_now"])


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_renders_as_transformers(name, i, monkeypatch):
    monkeypatch.setattr(chat, "datetime", FixedClock)  # the clock the goldens were made at
    t = next(t for t in GOLDENS["templates"] if t["name"] == name)
    case = t["cases"][i]
    call = lambda: chat.render(t["template"], case["messages"], add_generation_prompt=case["add_generation_prompt"],  # noqa: E731
                               tools=case["tools"], **case["kwargs"])
    if "error" in case:
        with pytest.raises(Exception) as e:
            call()
        assert f"{type(e.value).__name__}: {e.value}" == case["error"]
    else:
        assert call() == case["rendered"]


def test_every_family_template_renders_somewhere():
    assert {t["name"] for t in GOLDENS["templates"]} >= {"Qwen-Qwen3-0.6B", "Kimi-K2-Instruct", "GLM-4.7-Flash",
                                                        "deepseek-ai-DeepSeek-V3.1", "openai-gpt-oss-120b"}
    assert sum("rendered" in c for t in GOLDENS["templates"] for c in t["cases"]) >= 90


def test_the_sandbox_and_bad_data_are_refused():
    with pytest.raises(jinja2.exceptions.SecurityError):
        chat.render("{{ messages.__class__.__mro__ }}", [{"role": "user", "content": "x"}])
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore"):
        chat.render("{% set ns = namespace(_x=1) %}", [])
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        chat.render("{{ raise_exception('no system') }}", [])
    with pytest.raises(TypeError, match="JSON values"):
        chat.render("{{ messages }}", [{"role": "user", "content": object()}])
    with pytest.raises(TypeError, match="must be a dict"):
        chat.render("{{ messages }}", ["not a message"])
    assert chat.render("{{ x | tojson }}", [], x={"a": "é<"}) == '{"a": "é<"}'
    assert chat.render("{% generation %}kept{% endgeneration %}", []) == "kept"


def test_the_moekit_chat_template_command(tmp_path):
    import os
    import subprocess
    cli = os.environ.get("MOEKIT_CLI")
    if not cli:
        pytest.skip("MOEKIT_CLI is not set (ctest sets it to the build's moekit)")
    t = next(t for t in GOLDENS["templates"] if t["name"] == "Qwen-Qwen3-0.6B")
    case = t["cases"][1]
    (tmp_path / "t.jinja").write_text(t["template"], encoding="utf-8")
    (tmp_path / "m.json").write_text(json.dumps({"messages": case["messages"]}), encoding="utf-8")
    out = subprocess.run([cli, "chat-template", "--template", str(tmp_path / "t.jinja"), "--messages",
                          str(tmp_path / "m.json"), "--bos-token", "<BOS>", "--eos-token", "<EOS>"],
                         capture_output=True, text=True, encoding="utf-8")
    assert out.returncode == 0, out.stderr
    assert out.stdout == case["rendered"]
    bad = subprocess.run([cli, "chat-template", "--template", str(tmp_path / "t.jinja"), "--messages",
                          str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("moekit: error: chat-template: "), bad.stderr
