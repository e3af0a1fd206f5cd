"""The parts a server batches with: moekit.Sequence (a KV cache), Model.forward / Model.decode (several
sequences' decode steps in one pass) / Model.step (decode tokens and prompts' chunks in one pass), moekit.Sampler, Model.text_stream, the chat template and special
tokens of the model's file."""

import json
import pathlib
import shutil

import numpy as np
import pytest

import moekit

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "goldens"
MODELS = ROOT / "models"


def prompt(family):
    with open(MODELS / f"{family}.ref.json") as f:
        return json.load(f)["prompt_ids"]


@pytest.mark.parametrize("family", ["qwen3moe", "deepseek-v3"])
def test_decode_rows_are_each_sequence_alone_in_the_exact_mode(family):
    m = moekit.Model(str(MODELS / f"{family}.f32.gguf"), mode="exact")
    p = prompt(family)
    together = [m.new_sequence() for _ in range(3)]
    alone = [m.new_sequence() for _ in range(3)]
    for i, n in enumerate((12, 4, 9)):
        m.forward(together[i], p[:n])
        m.forward(alone[i], p[:n])
    for step in range(3):
        ids = [p[(3 * i + step) % len(p)] for i in range(3)]
        rows = m.decode(together, ids)
        assert rows.shape == (3, m.vocab_size) and rows.dtype == np.float32
        for i in range(3):
            assert np.array_equal(rows[i], m.forward(alone[i], [ids[i]])[0]), (step, i)
    assert [len(s) for s in together] == [15, 7, 12]


@pytest.mark.parametrize("family", ["qwen3moe", "deepseek-v2"])
def test_steps_mixing_prompt_chunks_and_decode_tokens_are_each_alone(family):
    m = moekit.Model(str(MODELS / f"{family}.f32.gguf"), mode="exact")
    p = prompt(family)
    a, b = m.new_sequence(), m.new_sequence()
    a_alone, b_alone = m.new_sequence(), m.new_sequence()
    m.forward(a, p[:5])
    m.forward(a_alone, p[:5])
    for step, chunk in enumerate([p[:4], p[4:8], p[8:]]):  # b's prompt in three chunks beside a's decoding
        tok = p[step]
        rows = m.step([a, b], [[tok], chunk])
        assert rows.shape == (2, m.vocab_size)
        assert np.array_equal(rows[0], m.forward(a_alone, [tok])[0]), step
        assert np.array_equal(rows[1], m.forward(b_alone, chunk)[0]), step
    assert (len(a), len(b)) == (8, len(p))
    with pytest.raises(ValueError, match="no tokens for sequence 1"):
        m.step([a, b], [[1], []])
    with pytest.raises(ValueError, match="1 token lists for 2 sequences"):
        m.step([a, b], [[1]])
    assert (len(a), len(b)) == (8, len(p))


def test_forward_returns_the_last_row_or_all():
    m = moekit.Model(str(MODELS / "deepseek-v2.f32.gguf"))
    p = prompt("deepseek-v2")
    s = m.new_sequence()
    all_rows = m.forward(s, p, all_logits=True)
    assert all_rows.shape == (len(p), m.vocab_size)
    t = m.new_sequence()
    assert np.array_equal(m.forward(t, p)[0], all_rows[-1])
    assert s.size == len(p) and s.capacity == m.info["ctx"] and s.nbytes == m.info["cache_bytes_per_token"] * s.capacity
    s.truncate(3)
    assert len(s) == 3


def test_errors_are_named():
    m = moekit.Model(str(MODELS / "qwen3moe.f32.gguf"))
    other = moekit.Model(str(MODELS / "olmoe.f32.gguf"))
    a = m.new_sequence()
    with pytest.raises(ValueError, match="same sequence"):
        m.decode([a, a], [1, 2])
    with pytest.raises(ValueError, match="another model"):
        m.decode([other.new_sequence()], [1])
    with pytest.raises(ValueError, match="2 token ids for 1 sequences"):
        m.decode([a], [1, 2])
    with pytest.raises(ValueError, match="another model"):
        m.forward(other.new_sequence(), [1])
    with pytest.raises(ValueError, match="temperature"):
        moekit.Sampler(temperature=-1.0)
    assert len(a) == 0


def test_sampler_is_greedy_at_zero_and_seeded_otherwise():
    logits = np.array([0.1, 2.0, 1.9, -1.0], dtype=np.float32)
    assert moekit.Sampler().sample(logits) == 1
    draws = [moekit.Sampler(temperature=1.0, seed=7).sample(logits, [1]) for _ in range(3)]
    assert len(set(draws)) == 1
    many = moekit.Sampler(temperature=1.5, seed=3)
    assert {many.sample(logits) for _ in range(200)} >= {1, 2}


def test_text_stream_chat_template_and_special_tokens(tmp_path):
    # the tiny qwen3moe model with the qwen3-style tokenizer of the tokenizer goldens beside it
    folder = tmp_path / "model"
    shutil.copytree(MODELS / "qwen3moe", folder)
    for name in ("tokenizer.json", "generation_config.json"):
        shutil.copy(ROOT / "tokenizer" / "qwen3" / name, folder / name)
    config = json.loads((ROOT / "tokenizer" / "qwen3" / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    m = moekit.Model(str(folder))
    ids = m.tokenize("héllo wörld", add_special=False)
    stream = m.text_stream()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "héllo wörld"
    assert m.chat_template == config["chat_template"]
    (folder / "chat_template.jinja").write_text("{{ bos_token }}jinja file wins")
    assert moekit.Model(str(folder)).chat_template == "{{ bos_token }}jinja file wins"
    special = m.special_tokens
    assert set(special) == {"bos_token", "eos_token", "bos_id", "eos_id"}
    assert special["eos_token"] is None or isinstance(special["eos_token"], str)
    assert m.is_end_of_generation(m.tokenize("<|im_end|>", add_special=False)[0])
    assert moekit.Model(str(MODELS / "qwen3moe.f32.gguf")).chat_template is None
