"""moekit.Model: whole models from Python, held to transformers' float64 forward of the tiny
random models in tests/goldens/models (written by make_model_goldens.py there), from the GGUF that
llama.cpp's converter wrote and from the HF folder."""

import json
import pathlib
import threading

import numpy as np
import pytest

import moekit

MODELS = pathlib.Path(__file__).resolve().parents[2] / "tests" / "goldens" / "models"
FAMILIES = ["qwen3moe", "qwen2moe", "mixtral", "olmoe", "glm4moe", "gpt-oss", "minimax-m2", "llama4", "deepseek-v2",
            "deepseek-v3", "glm4-moe-lite"]


def reference(family):
    with open(MODELS / f"{family}.ref.json") as f:
        return json.load(f)


def gguf_field(ref, field):
    # llama.cpp hardcodes Llama-4's attention constants; the generator gives the reference for them.
    return field + "_gguf" if field + "_gguf" in ref else field


def relative_error(got, want):
    want = np.asarray(want, dtype=np.float64)
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_logits_and_greedy_tokens_match_transformers(family):
    ref = reference(family)
    model = moekit.Model(str(MODELS / f"{family}.f32.gguf"))
    logits = model.logits(ref["prompt_ids"])
    assert logits.dtype == np.float32
    assert logits.shape == (len(ref["prompt_ids"]), model.vocab_size)
    assert relative_error(logits, ref[gguf_field(ref, "logits")]) < 2e-5
    out = model.generate(ref["prompt_ids"], max_tokens=len(ref["greedy_ids"]))
    want = ref[gguf_field(ref, "greedy_ids")]
    assert out["ids"] == want[: len(out["ids"])]
    assert out["prompt_ids"] == ref["prompt_ids"]


@pytest.mark.parametrize("family", ["qwen3moe", "gpt-oss"])
def test_folder_logits_match_transformers(family):
    ref = reference(family)
    model = moekit.Model(str(MODELS / family))
    assert relative_error(model.logits(ref["prompt_ids"]), ref["logits"]) < 2e-5


def test_on_token_streams_each_token_and_can_stop():
    model = moekit.Model.random(3)
    seen = []
    out = model.generate([1, 2, 3], max_tokens=8, on_token=lambda i, text: seen.append(i) or len(seen) < 5)
    assert seen == out["ids"] and len(seen) == 5


def test_an_on_token_that_returns_none_goes_on():
    model = moekit.Model.random(3)
    seen = []
    out = model.generate([1, 2, 3], max_tokens=6, on_token=lambda i, text: seen.append(i))
    assert seen == out["ids"] and len(seen) == 6


def test_a_python_exception_in_on_token_reaches_the_caller():
    model = moekit.Model.random(3)

    def boom(i, text):
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        model.generate([1, 2, 3], max_tokens=4, on_token=boom)


def test_sampling_is_seeded_and_threads_get_the_same_tokens():
    model = moekit.Model.random(5)
    kw = dict(max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=11)
    a = model.generate([5, 6, 7], **kw)["ids"]
    assert a == model.generate([5, 6, 7], **kw)["ids"]
    results = [None] * 3

    def run(i):
        results[i] = model.generate([5, 6, 7], **kw)["ids"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [a] * 3


def test_errors_name_what_was_wrong():
    model = moekit.Model.random(1, ctx=16)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.logits([model.vocab_size])
    with pytest.raises(ValueError, match="context"):
        model.generate(list(range(1, 20)), max_tokens=1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate([1], temperature=-1.0)
    with pytest.raises(ValueError, match="no tokenizer"):
        model.generate("hello")
    with pytest.raises(ValueError, match="mode"):
        moekit.Model.random(1, mode="fast")
    with pytest.raises(RuntimeError, match="nonexistent"):
        moekit.Model("/nonexistent/model.gguf")


def test_the_files_tokenizer_decodes_and_streams_text():
    # The converter's stub vocabulary of the tiny GGUFs spells token i as '<ti>'.
    model = moekit.Model(str(MODELS / "qwen3moe.f32.gguf"))
    assert model.has_tokenizer
    assert model.detokenize([35, 72]) == "<t35><t72>"
    ref = reference("qwen3moe")
    pieces = []
    out = model.generate(ref["prompt_ids"], max_tokens=4, on_token=lambda i, text: pieces.append(text) or True)
    assert out["text"] == "".join(f"<t{i}>" for i in ref["greedy_ids"][:4]) == "".join(pieces)
    folder = moekit.Model(str(MODELS / "qwen3moe"))
    assert not folder.has_tokenizer and folder.generate(ref["prompt_ids"], max_tokens=1)["text"] is None
    with pytest.raises(ValueError, match="no tokenizer"):
        folder.tokenize("hello")
