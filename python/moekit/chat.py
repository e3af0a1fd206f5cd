"""Chat templates, rendered as transformers' ``apply_chat_template`` renders them.

A model's chat template is Jinja (``Model.chat_template``: a GGUF's ``tokenizer.chat_template``, a
folder's ``chat_template.jinja`` or ``tokenizer_config.json``). transformers renders it with jinja2 in
a sandbox with settings and helpers of its own; moekit renders it with jinja2 in the same
environment, so the text is byte for byte transformers' (tests: python/tests/test_chat.py against
transformers' renderings of real templates, tests/goldens/chat):

- ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with ``loopcontrols`` and
  the ``{% generation %}`` block (rendered as its body);
- the ``tojson`` filter as ``json.dumps(x, ensure_ascii=False, indent=..., separators=...,
  sort_keys=...)`` (not Jinja's HTML-escaping one);
- the globals ``raise_exception(message)`` (a ``jinja2.TemplateError``), ``strftime_now(format)``,
  ``dict`` and ``namespace`` (a namespace refuses names starting with ``_``);
- the variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and any keyword
  given (``bos_token``, ``eos_token``, ``enable_thinking``, ...);
- a message's reasoning given as ``reasoning_content``, ``thinking`` or ``reasoning`` is passed
  under both ``reasoning_content`` and ``thinking`` (as transformers aliases them).

Needs jinja2 >= 3.1.6 (what transformers requires: older versions have sandbox escapes).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@functools.lru_cache(maxsize=16)
def compile_template(template: str):
    """The compiled template (cached), in transformers' environment. Raises jinja2.TemplateSyntaxError."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
    if version < (3, 1, 6):
        raise ImportError(f"moekit.chat needs jinja2 >= 3.1.6 (older versions have sandbox escapes), "
                          f"found {jinja2.__version__}")

    class Generation(jinja2.ext.Extension):
        # transformers' AssistantTracker without the tracking: {% generation %}...{% endgeneration %}
        # renders its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


def _plain(value):
    # JSON's types only (what a request carries); anything else is refused rather than handed to a
    # template from the Hub.
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TypeError(f"chat template data must be JSON values (dict, list, str, number, bool, None), got {value!r}")


def _alias_reasoning(messages):
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise TypeError(f"a chat message must be a dict, got {m!r}")
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def render(template: str, messages: list, *, add_generation_prompt: bool = False, tools: list | None = None,
           documents: list | None = None, **kwargs) -> str:
    """``template`` rendered for ``messages`` as transformers' ``apply_chat_template(..., tokenize=False)``
    renders it, with ``kwargs`` (``bos_token=``, ``eos_token=``, ...) as template variables.

    Raises jinja2.TemplateError (a template's own ``raise_exception``, a syntax error) and TypeError
    (messages that are not JSON dicts)."""
    return compile_template(template).render(
        messages=_alias_reasoning(_plain(messages)),
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **_plain(kwargs),
    )


def main(argv=None):
    """`moekit chat-template`: prints the rendering and nothing else (no newline added)."""
    import sys

    from moekit._cli import ContractParser

    ap = ContractParser("chat-template")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--model")
    source.add_argument("--template")
    ap.add_argument("--messages", required=True)
    ap.add_argument("--no-generation-prompt", action="store_true")
    ap.add_argument("--bos-token")
    ap.add_argument("--eos-token")
    args = ap.parse_args(argv)
    try:
        with open(args.messages, encoding="utf-8") as f:
            data = json.load(f)
        tools = None
        if isinstance(data, dict):
            data, tools = data.get("messages"), data.get("tools")
        if not isinstance(data, list):
            ap.error(f"{args.messages}: expected a list of messages or an object with 'messages'")
        bos, eos = args.bos_token, args.eos_token
        if args.template:
            with open(args.template, encoding="utf-8") as f:
                template = f.read()
        else:
            import moekit

            model = moekit.Model(args.model)
            template = model.chat_template
            if template is None:
                ap.error(f"{args.model} has no chat template")
            special = model.special_tokens
            bos = special["bos_token"] if bos is None else bos
            eos = special["eos_token"] if eos is None else eos
        text = render(template, data, add_generation_prompt=not args.no_generation_prompt, tools=tools,
                      bos_token=bos or "", eos_token=eos or "")
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - one line, the CLI's contract
        ap.error(f"{type(e).__name__}: {e}")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
