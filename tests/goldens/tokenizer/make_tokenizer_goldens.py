#!/usr/bin/env python3
"""Tokenizer goldens for tests/tokenizer/tokenizer_test.cpp: the ids Hugging Face's `tokenizers`
library gives, for moekit's tokenizers to equal. CI never runs this; the tests only read its output.

What it writes into this folder (docs/tokenizers.md, "How it is tested"):

1. `ggml-vocab-<name>.gguf` + `.gguf.inp` + `.gguf.out` (with --llama-cpp): llama.cpp's own
   vocabulary test files, copied unchanged from its `models/` folder, for the tokenizers moekit's
   families use: llama-spm (Mixtral), llama-bpe (Llama 3), qwen2 (Qwen2/Qwen3-MoE), deepseek-llm,
   deepseek-coder, gpt-2; and qwen35's `.inp` and `.out` (its GGUF is qwen2's with the pre-tokenizer
   name changed, checked here byte for byte; the test makes it so). `.inp` holds texts, each followed by a line `__ggml_vocab_test__`; `.out`
   one line of ids per text: what the model's own tokenizer gives with add_special_tokens=False
   (llama.cpp's tests/test-tokenizer-0 compares them the same way).

2. `gguf_reference.json`: for each of those vocabularies, the tokenizers library's ids for the
   EXTRA texts below (special tokens written in text, emoji, CJK, non-NFC text, long whitespace
   runs, code, ...). The tokenizer.json they come from is built here from the GGUF's vocabulary the
   way the model's release writes it (normalizer, pre-tokenizer splits, post-processor), and is first
   checked to give the `.out` ids for every `.inp` text; it is not kept (it would take 30 MB).

3. One folder per family style (`qwen3/`, `mixtral/`, `gpt-oss/`, `llama4/`, `glm45/`,
   `minimax-m2/`, `olmoe/`): a small tokenizer.json (+ tokenizer_config.json, generation_config.json)
   shaped as that family's release is, with a vocabulary cut down from one of the GGUFs above (the
   byte alphabet and the first 3000 merges; Mixtral's: bytes, single characters and the 3000
   best-scored pieces, its merges made by transformers' own generate_merges), its specials as the
   release names them; `vocab.gguf`, the same vocabulary as llama.cpp's converter writes it (the
   family's tokenizer.ggml.pre name, token types, special ids); and `reference.json`, the tokenizers
   library's ids for every text (the `.inp` texts and the extra ones) three ways (plain: no special
   tokens added; special: add_special_tokens=True; no_parse: plain with encode_special_tokens, so
   special tokens in the text are text), and its decode of the plain ids.

4. `features-bytelevel/` and `features-metaspace/`: two tokenizer.json folders (no GGUF can say
   this much) for the components no family above uses: NFKC and a regex Replace, Digits, every
   Split behavior, ByteLevel with add_prefix_space, added tokens with lstrip / rstrip / single_word
   / normalized, a BOS + EOS template; a Metaspace pre-tokenizer and decoder; with their
   `reference.json` for every text and a few more.

Regenerate (from the repository root; the Hugging Face Hub is not needed):

    python3 -m venv /work/peers/tokvenv
    /work/peers/tokvenv/bin/pip install tokenizers transformers gguf sentencepiece protobuf
    /work/peers/tokvenv/bin/python tests/goldens/tokenizer/make_tokenizer_goldens.py \\
        --llama-cpp /path/to/llama.cpp

Made with tokenizers 0.23.3, transformers 5.25.0, gguf 0.19.0 (the versions are also recorded in
each reference file); llama.cpp's vocab files from llama-cpp-python 0.3.36's vendored llama.cpp.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import gguf
import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers.tokenization_utils_base import generate_merges

HERE = Path(__file__).resolve().parent
VOCABS = ["llama-spm", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "gpt-2"]
MERGES_KEPT = 3000

EXTRA_TEXTS = [
    "",
    " ",
    "Hello world",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>x<|endoftext|",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<s>[INST] What is 2+2? [/INST]</s>",
    "Hello</s>world<s> <unk>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|start|>assistant<|channel|>final<|message|>Hi there<|end|><|return|><|call|>",
    "[gMASK]<sop><|user|>\nhello<|assistant|>\n<think></think>ok<|observation|>",
    "]~!b[]~b]user\nhi[e~[",
    "<|padding|>mail me at |||EMAIL_ADDRESS||| or |||PHONE_NUMBER|||",
    "🦙🔥👩‍👩‍👧‍👦 🇫🇷 ✅ ❤️",
    "你好，世界！こんにちは 안녕하세요 สวัสดี",
    "e\u0301cole, \u212b, \ufb01ne, A\u030a",
    "a\u0085b\u00a0c\u3000d\u2028e",
    "\ufeffBOM a\u200bb",
    " " * 40 + "x" + " " * 17,
    "\n" * 12 + "\t\t \r\n\r\n  \n",
    "def f(x):\n    return x**2  # square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] << 2; }  // done",
    "I'LL DON'T we'Ve she'S it'd You're",
    "1234567890 3.14159 ١٢٣٤ ½ ⅔ Ⅻ 10,000,000",
    "ǅungla ǈ ǋ ΑΒΓ αβγ HELLOworld helloWORLD iPhone McDonald's",
    "नमस्ते दुनिया مرحبا بالعالم Привет мир",
    "https://example.com/path?q=1&r=2#frag user@example.org",
    "line1\r\nline2\r\n\r\n",
    "   leading and trailing   ",
    "ö ø ú ÿ õ ÷ Á ý À",
]


def read_inp(path):
    """llama.cpp's test format: every text followed by a line __ggml_vocab_test__."""
    raw = path.read_text(encoding="utf-8")
    sep = "\n__ggml_vocab_test__\n"
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(sep)
    return texts


def read_out(path):
    return [[int(t) for t in line.split()] for line in path.read_text(encoding="utf-8").split("\n")[:-1]]


def gguf_vocab(path):
    r = gguf.GGUFReader(str(path))
    f = r.fields

    def get(key, default=None):
        return f[key].contents() if key in f else default

    return {
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"),
        "types": get("tokenizer.ggml.token_type"),
        "scores": get("tokenizer.ggml.scores"),
        "merges": get("tokenizer.ggml.merges"),
        "bos": get("tokenizer.ggml.bos_token_id"),
        "eos": get("tokenizer.ggml.eos_token_id"),
    }


# ---- tokenizer.json as the releases write them -----------------------------------------------

SPLITS = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt4o": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
DEEPSEEK_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


BYTE_LEVEL_NO_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
BYTE_LEVEL_POST = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
SPM_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}


def bos_template(bos, bos_id):
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


# Per vocabulary: the release's normalizer, pre-tokenizer and post-processor (None: the default).
def release_parts(name, bos, bos_id):
    if name == "llama-bpe":  # Meta-Llama-3
        return None, {"type": "Sequence", "pretokenizers": [split(SPLITS["llama3"]), BYTE_LEVEL_NO_REGEX]}, {
            "type": "Sequence", "processors": [BYTE_LEVEL_POST, bos_template(bos, bos_id)]}, True
    if name == "qwen2":  # Qwen1.5 / Qwen2 / Qwen3
        return {"type": "NFC"}, {"type": "Sequence", "pretokenizers": [split(SPLITS["qwen2"]), BYTE_LEVEL_NO_REGEX]}, \
            BYTE_LEVEL_POST, False
    if name == "deepseek-llm":
        pre = [split("[\r\n]"), split(DEEPSEEK_LETTERS), split(DEEPSEEK_PUNCT), split("\\s+$"), split(DEEPSEEK_CJK),
               split("\\p{N}+"), BYTE_LEVEL_NO_REGEX]
        return {"type": "Sequence", "normalizers": []}, {"type": "Sequence", "pretokenizers": pre}, \
            bos_template(bos, bos_id), False
    if name == "deepseek-coder":
        pre = [split("[\r\n]"), split("\\s?\\p{L}+"), split("\\s?\\p{P}+"), split(DEEPSEEK_CJK), split("\\p{N}"),
               BYTE_LEVEL_NO_REGEX]
        return {"type": "Sequence", "normalizers": []}, {"type": "Sequence", "pretokenizers": pre}, \
            bos_template(bos, bos_id), False
    if name == "gpt-2":
        return None, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, \
            BYTE_LEVEL_POST, False
    raise KeyError(name)


def added(token_id, content, special=True):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def byte_level_json(tokens, types, merges, name, bos, bos_id, ignore_merges=None):
    """A byte-level tokenizer.json: normal tokens in model.vocab, control / user-defined ones as
    added tokens (as the releases keep them)."""
    vocab, specials = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (3, 4):
            specials.append(added(i, t, special=ty == 3))
        else:
            vocab[t] = i
    normalizer, pre, post, ign = release_parts(name, bos, bos_id)
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
        "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post, "decoder": BYTE_LEVEL_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ign if ignore_merges is None else ignore_merges,
                  "vocab": vocab, "merges": [m.split(" ", 1) for m in merges]},
    }


def spm_json(tokens, types, scores, bos_id):
    """Llama-2 / Mixtral: SentencePiece BPE with byte fallback; merges from the scores by
    transformers' generate_merges; <unk>, <s>, </s> both in the vocabulary and added."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = generate_merges(vocab, {t: s for t, s in zip(tokens, scores)})
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(i, t) for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (2, 3)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": bos_template(tokens[bos_id], bos_id),
        "decoder": SPM_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }


def hf_ids(tok, texts):
    plain = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    special = [tok.encode(t, add_special_tokens=True).ids for t in texts]
    tok.encode_special_tokens = True
    no_parse = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    tok.encode_special_tokens = False
    decoded = [tok.decode(ids, skip_special_tokens=False) for ids in plain]
    return {"plain": plain, "special": special, "no_parse": no_parse, "decode": decoded}


def versions():
    return {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", "0.19.0")}


# ---- 1 + 2: llama.cpp's vocabularies ---------------------------------------------------------

def full_vocabs(texts_extra):
    ref = {"generated_by": "make_tokenizer_goldens.py", "versions": versions(), "texts": texts_extra, "vocabs": {}}
    for name in VOCABS:
        path = HERE / f"ggml-vocab-{name}.gguf"
        v = gguf_vocab(path)
        if v["model"] == "llama":
            j = spm_json(v["tokens"], v["types"], v["scores"], v["bos"])
        else:
            bos = v["tokens"][v["bos"]]
            j = byte_level_json(v["tokens"], v["types"], v["merges"], name, bos, v["bos"])
        tok = Tokenizer.from_str(json.dumps(j))
        inp, out = read_inp(Path(str(path) + ".inp")), read_out(Path(str(path) + ".out"))
        assert len(inp) == len(out), name
        bad = [(t, tok.encode(t, add_special_tokens=False).ids, o) for t, o in zip(inp, out)
               if tok.encode(t, add_special_tokens=False).ids != o]
        if bad:
            sys.exit(f"{name}: the tokenizer.json built here does not give llama.cpp's .out ids: {bad[:3]}")
        print(f"{name}: {len(inp)} .inp texts give the .out ids")
        ref["vocabs"][name] = hf_ids(tok, texts_extra)
    (HERE / "gguf_reference.json").write_text(json.dumps(ref, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


# ---- 3: small tokenizers shaped as each family's release -------------------------------------

def cut_byte_level(v, keep):
    """The byte alphabet and the first `keep` merges whose pieces are already kept, with their
    results; normal tokens only, renumbered in their original order."""
    alphabet = set(gguf_bytes_to_unicode().values())
    index = {t: i for i, t in enumerate(v["tokens"])}
    kept = {t for t in alphabet if t in index}
    merges = []
    for m in v["merges"]:
        a, b = m.split(" ", 1)
        if a in kept and b in kept and (a + b) in index:
            merges.append(m)
            kept.add(a + b)
            if len(merges) == keep:
                break
    tokens = sorted(kept, key=lambda t: index[t])
    return tokens, merges


def gguf_bytes_to_unicode():
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    return bytes_to_unicode()


def write_gguf(path, arch, model, pre, tokens, types, merges=None, scores=None, ids=None, flags=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in (ids or {}).items():
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    for key, value in (flags or {}).items():
        w.add_bool(f"tokenizer.ggml.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


STYLES = {
    # family: (source vocabulary, pre name, split, specials (content, special?), config, gguf ids, gguf flags)
    "qwen3": dict(
        source="qwen2", pre="qwen2", split="qwen2", normalizer={"type": "NFC"}, post=BYTE_LEVEL_POST, arch="qwen3moe",
        specials=[("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|fim_prefix|>", True),
                  ("<|fim_middle|>", True), ("<|fim_suffix|>", True), ("<|fim_pad|>", True), ("<|repo_name|>", True),
                  ("<|file_sep|>", True), ("<tool_call>", False), ("</tool_call>", False), ("<think>", False),
                  ("</think>", False)],
        config={"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False},
        generation={"eos_token_id": ["<|im_end|>", "<|endoftext|>"]},
        ids={"eos": "<|im_end|>", "padding": "<|endoftext|>", "bos": "<|endoftext|>"}, flags={"add_bos_token": False}),
    "gpt-oss": dict(
        source="llama-bpe", pre="gpt-4o", split="gpt4o", normalizer=None, post=BYTE_LEVEL_POST, arch="gpt-oss",
        specials=[("<|startoftext|>", True), ("<|endoftext|>", True), ("<|return|>", True), ("<|constrain|>", True),
                  ("<|channel|>", True), ("<|start|>", True), ("<|end|>", True), ("<|message|>", True),
                  ("<|call|>", True)],
        config={"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
        generation={"eos_token_id": ["<|return|>", "<|endoftext|>", "<|call|>"]},
        ids={"bos": "<|startoftext|>", "eos": "<|return|>", "padding": "<|endoftext|>"}, flags={}),
    "llama4": dict(
        source="llama-bpe", pre="llama4", split="gpt4o", normalizer=None, arch="llama4",
        post="bos", bos="<|begin_of_text|>",
        specials=[("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|header_start|>", True),
                  ("<|header_end|>", True), ("<|eom|>", True), ("<|eot|>", True), ("<|python_start|>", True)],
        config={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>", "pad_token": "<|end_of_text|>"},
        generation={"eos_token_id": ["<|end_of_text|>", "<|eom|>", "<|eot|>"]},
        ids={"bos": "<|begin_of_text|>", "eos": "<|eot|>", "padding": "<|end_of_text|>"},
        flags={"add_bos_token": True}),
    "glm45": dict(
        source="llama-bpe", pre="glm4", split="llama3", normalizer=None, post=BYTE_LEVEL_POST, arch="glm4moe",
        ignore_merges=True,
        specials=[("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True), ("<sop>", True),
                  ("<eop>", True), ("<|system|>", True), ("<|user|>", True), ("<|assistant|>", True),
                  ("<|observation|>", True), ("<think>", False), ("</think>", False)],
        config={"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        generation={"eos_token_id": ["<|endoftext|>", "<|user|>", "<|observation|>"]},
        ids={"bos": "[gMASK]", "eot": "<|user|>", "unknown": "<|endoftext|>", "eom": "<|observation|>",
             "eos": "<|endoftext|>", "padding": "<|endoftext|>"}, flags={}),
    "minimax-m2": dict(
        source="llama-bpe", pre="minimax-m2", split="gpt4o", normalizer=None, post=BYTE_LEVEL_POST, arch="minimax-m2",
        specials=[("]!p~[", True), ("]~b]", True), ("]~!b[", True), ("[e~[", True), ("]!d~[", True),
                  ("<think>", False), ("</think>", False), ("<minimax:tool_call>", False)],
        config={"bos_token": "]~!b[", "eos_token": "[e~[", "unk_token": "]!d~["},
        generation={"eos_token_id": ["[e~["]},
        ids={"bos": "]~!b[", "eos": "[e~[", "unknown": "]!d~["}, flags={}),
    "olmoe": dict(
        source="gpt-2", pre="olmo", split=None, normalizer=None, post=BYTE_LEVEL_POST, arch="olmoe",
        specials=[("<|endoftext|>", True), ("<|padding|>", True), ("|||EMAIL_ADDRESS|||", False),
                  ("|||PHONE_NUMBER|||", False), ("|||IP_ADDRESS|||", False)],
        config={"eos_token": "<|endoftext|>", "pad_token": "<|padding|>", "bos_token": None},
        generation={"eos_token_id": ["<|endoftext|>"]},
        ids={"eos": "<|endoftext|>", "padding": "<|padding|>", "bos": "<|endoftext|>"}, flags={}),
}


def write_folder(folder, j, config, generation):
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1) + "\n",
                                                  encoding="utf-8")
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n", encoding="utf-8")


def byte_level_style(name, s, texts):
    v = gguf_vocab(HERE / f"ggml-vocab-{s['source']}.gguf")
    tokens, merges = cut_byte_level(v, MERGES_KEPT)
    tokens = tokens + [c for c, _ in s["specials"]]
    types = [1] * (len(tokens) - len(s["specials"])) + [3 if sp else 4 for _, sp in s["specials"]]
    index = {t: i for i, t in enumerate(tokens)}
    if s["split"] is None:
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        pre = {"type": "Sequence", "pretokenizers": [split(SPLITS[s["split"]]), BYTE_LEVEL_NO_REGEX]}
    post = bos_template(s["bos"], index[s["bos"]]) if s["post"] == "bos" else s["post"]
    specials = [added(i, t, special=ty == 3) for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
        "normalizer": s["normalizer"], "pre_tokenizer": pre, "post_processor": post, "decoder": BYTE_LEVEL_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": s.get("ignore_merges", False),
                  "vocab": {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1},
                  "merges": [m.split(" ", 1) for m in merges]},
    }
    folder = HERE / name
    generation = {k: [index[t] for t in vals] for k, vals in s["generation"].items()}
    write_folder(folder, j, s["config"], generation)
    write_gguf(folder / "vocab.gguf", s["arch"], "gpt2", s["pre"], tokens, types, merges=merges,
               ids={k: index[t] for k, t in s["ids"].items()}, flags=s["flags"])
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def mixtral_style(texts):
    """Mixtral-8x7B's tokenizer is Llama-2's: SentencePiece BPE with byte fallback."""
    v = gguf_vocab(HERE / "ggml-vocab-llama-spm.gguf")
    toks, types, scores = v["tokens"], v["types"], v["scores"]
    normal = [i for i, ty in enumerate(types) if ty == 1]
    singles = {i for i in normal if len(toks[i]) == 1}
    best = sorted((i for i in normal if len(toks[i]) > 1), key=lambda i: -scores[i])[:MERGES_KEPT]
    keep = sorted(set(i for i, ty in enumerate(types) if ty != 1) | singles | set(best))
    tokens = [toks[i] for i in keep]
    ttypes = [int(types[i]) for i in keep]
    tscores = [float(scores[i]) for i in keep]
    j = spm_json(tokens, ttypes, tscores, 1)
    folder = HERE / "mixtral"
    write_folder(folder, j, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                             "add_eos_token": False}, {"bos_token_id": 1, "eos_token_id": 2})
    write_gguf(folder / "vocab.gguf", "llama", "llama", "default", tokens, ttypes, scores=tscores,
               ids={"bos": 1, "eos": 2, "unknown": 0}, flags={"add_bos_token": True, "add_eos_token": False})
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def styles(texts):
    for name, s in STYLES.items():
        tok = byte_level_style(name, s, texts)
        write_reference(HERE / name, tok, texts)
    write_reference(HERE / "mixtral", mixtral_style(texts), texts)


# ---- 4: the components no family above uses, against the library too (folders only) ----------

FEATURE_TEXTS = [
    "a <mask> b <mask>c<mask>",
    "hello<|user|>   world <|user|>\n\nx",
    "word words sword word. (word) _word word_",
    "x-y-z -- a- -b 12345 6.78",
    "\uff11\uff12\uff13 \uff21\uff22\uff23 \u2460 \ufb01 Lower LOWER lower",
    "  leading, trailing  ",
    "tab\there\nnew line",
]


def added_flags(token_id, content, special, lstrip=False, rstrip=False, single_word=False, normalized=False):
    return {"id": token_id, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def feature_styles(texts):
    """Two tokenizers that exercise the remaining components: NFKC and a regex Replace, Digits,
    every Split behavior, ByteLevel with add_prefix_space, added tokens with lstrip / rstrip /
    single_word / normalized, a BOS + EOS template; and a Metaspace pre-tokenizer ("first", split)
    with its decoder over a SentencePiece vocabulary."""
    v = gguf_vocab(HERE / "ggml-vocab-gpt-2.gguf")
    tokens, merges = cut_byte_level(v, MERGES_KEPT)
    n = len(tokens)
    specials = [added_flags(n, "<s>", True), added_flags(n + 1, "</s>", True),
                added_flags(n + 2, "<mask>", True, lstrip=True), added_flags(n + 3, "<|user|>", True, rstrip=True),
                added_flags(n + 4, "word", False, single_word=True), added_flags(n + 5, "lower", False, normalized=True)]
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [n], "tokens": ["<s>"]},
                           "</s>": {"id": "</s>", "ids": [n + 1], "tokens": ["</s>"]}},
    }
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": "L(OWER|ower)"}, "content": "lower"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[()]"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"String": "\t"}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[.,]"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": "_+"}, "behavior": "Isolated", "invert": True},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]},
        "post_processor": template,
        "decoder": BYTE_LEVEL_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [m.split(" ", 1) for m in merges]},
    }
    folder = HERE / "features-bytelevel"
    write_folder(folder, j, {"bos_token": "<s>", "eos_token": "</s>"}, None)
    write_reference(folder, Tokenizer.from_file(str(folder / "tokenizer.json")), texts)

    m = json.loads((HERE / "mixtral" / "tokenizer.json").read_text(encoding="utf-8"))
    m["normalizer"] = None
    m["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    m["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    folder = HERE / "features-metaspace"
    write_folder(folder, m, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, None)
    write_reference(folder, Tokenizer.from_file(str(folder / "tokenizer.json")), texts)


def write_reference(folder, tok, texts):
    ref = {"generated_by": "make_tokenizer_goldens.py", "versions": versions(), "texts": texts}
    ref.update(hf_ids(tok, texts))
    (folder / "reference.json").write_text(json.dumps(ref, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"{folder.name}: {tok.get_vocab_size()} tokens, {len(texts)} texts")


# Kimi-K2's pre-tokenizer (tokenization_kimi.py, a tiktoken pattern whose classes intersect sets with
# `&&`, which fancy-regex and Python's `regex` (V1) read and PCRE2 does not); llama.cpp's "kimi-k2"
# pre is a hand-written splitter of the same pattern. kimi_k2_splits.json: the byte spans Python's
# `regex` gives for each text; moekit's PCRE2 spelling must give the same.
KIMI_K2_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
KIMI_TEXTS = ["Hello world", "I'm here, you're THERE's 12345678 items.", "中文测试Hello世界World",
              "日本語のテキストとカタカナ", "  leading\n\n\ttabs   and   spaces  \n", "Ünïcödé ÇAPITALS and émojis 😀👍🏽!!",
              "x=1+2; y = f(x)//3\r\nreturn y", "混合text和数字123四五六", "한국어 텍스트와 English", "ΑΒΓ αβγ Дом дом",
              "don'T DON'T Don't", "a\u0301e\u0301 combining", "ＡＢＣ全角ｶﾀｶﾅ", "\u3007\u3021\u9fff\U00020000 ext"]


def kimi_k2_splits(texts):
    import regex

    cases = []
    for t in texts:
        spans = [[len(t[:m.start()].encode()), len(t[:m.end()].encode())]
                 for m in regex.finditer(KIMI_K2_PATTERN, t, flags=regex.V1)]
        cases.append({"text": t, "spans": spans})
    (HERE / "kimi_k2_splits.json").write_text(
        json.dumps({"pattern": KIMI_K2_PATTERN, "regex": regex.__version__, "cases": cases}, ensure_ascii=False,
                   indent=1) + "\n", encoding="utf-8")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, help="a llama.cpp checkout: copy its vocab test files first")
    args = ap.parse_args()
    if args.llama_cpp:
        models = args.llama_cpp / "models"
        for name in VOCABS:
            for ext in (".gguf", ".gguf.inp", ".gguf.out"):
                shutil.copyfile(models / f"ggml-vocab-{name}{ext}", HERE / f"ggml-vocab-{name}{ext}")
        # qwen35: only its texts. Its GGUF is the qwen2 one with tokenizer.ggml.pre = "qwen35", byte
        # for byte (checked here), which the test rebuilds rather than keep 5.9 MB twice.
        for ext in (".gguf.inp", ".gguf.out"):
            shutil.copyfile(models / f"ggml-vocab-qwen35{ext}", HERE / f"ggml-vocab-qwen35{ext}")
        qwen2 = (models / "ggml-vocab-qwen2.gguf").read_bytes()
        key = b"tokenizer.ggml.pre\x08\x00\x00\x00" + (5).to_bytes(8, "little") + b"qwen2"
        patched = qwen2.replace(key, b"tokenizer.ggml.pre\x08\x00\x00\x00" + (6).to_bytes(8, "little") + b"qwen35")
        if patched != (models / "ggml-vocab-qwen35.gguf").read_bytes():
            sys.exit("ggml-vocab-qwen35.gguf is not ggml-vocab-qwen2.gguf with its pre-tokenizer renamed")
    inp = read_inp(HERE / "ggml-vocab-qwen2.gguf.inp")
    full_vocabs(EXTRA_TEXTS)
    styles(inp + EXTRA_TEXTS)
    feature_styles(inp + EXTRA_TEXTS + FEATURE_TEXTS)
    kimi_k2_splits(KIMI_TEXTS + EXTRA_TEXTS)


if __name__ == "__main__":
    main()
