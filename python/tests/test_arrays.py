"""Arrays across the boundary: zero copies in and out, the one documented copy (non-contiguous
input), and every bad input raising the right exception with moekit's message."""

import os

import numpy as np
import pytest

import moekit
from conftest import GOLDENS

try:
    import torch
except ImportError:  # the torch tests below say so
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (scripts/setup.sh --goldens)")


@pytest.fixture(scope="module")
def layer():
    return moekit.load_moe_layer(str(GOLDENS / "qwen2_moe"), 1)


def x_for(layer, T=16, seed=0):
    return np.random.default_rng(seed).standard_normal((T, layer.config.hidden_size), dtype=np.float32)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_numpy_input_is_read_in_place(layer):
    x = x_for(layer)
    address, copied = moekit._moekit._input_address(x)
    assert address == x.ctypes.data and not copied
    # Read-only arrays are fine too (moekit never writes its input).
    x.flags.writeable = False
    assert moekit._moekit._input_address(x) == (x.ctypes.data, False)
    layer.forward(x)


def test_non_contiguous_input_is_copied_once_and_correct(layer):
    big = x_for(layer, T=32)
    x = big[::2]  # every other row: strided
    address, copied = moekit._moekit._input_address(x)
    assert copied and address != x.ctypes.data
    np.testing.assert_array_equal(layer.forward(x), layer.forward(np.ascontiguousarray(x)))
    xt = np.asfortranarray(x_for(layer))
    np.testing.assert_array_equal(layer.forward(xt), layer.forward(np.ascontiguousarray(xt)))


def test_output_is_handed_over_without_a_copy(layer):
    y = layer.forward(x_for(layer))
    # numpy wraps moekit's buffer: it does not own the data, a nanobind owner does.
    assert not y.flags.owndata and y.base is not None and y.flags.writeable
    y[0, 0] = 1.0  # the caller's to keep and change


def test_large_input_costs_no_copy(layer):
    T = 1 << 19  # 512K tokens: x is 512K * D * 4 bytes
    x = np.ones((T, layer.config.hidden_size), dtype=np.float32)
    layer.forward(x[:1024])  # warm the thread pool and allocator
    before = rss_bytes()
    address, copied = moekit._moekit._input_address(x)
    assert address == x.ctypes.data and not copied
    assert rss_bytes() - before < x.nbytes // 8


@needs_torch
def test_torch_in_torch_out(layer):
    x = torch.from_numpy(x_for(layer))
    assert moekit._moekit._input_address(x) == (x.data_ptr(), False)
    y = layer.forward(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == x.shape
    np.testing.assert_array_equal(y.numpy(), layer.forward(x.numpy()))
    y2, ids, w, logits = layer.forward(x, return_routing=True)
    assert all(isinstance(t, torch.Tensor) for t in (y2, ids, w, logits)) and ids.dtype == torch.int32


@needs_torch
def test_torch_bf16(layer):
    x = torch.from_numpy(x_for(layer)).to(torch.bfloat16)
    y = layer.forward(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    ref = layer.forward(x.float().numpy())
    assert float(np.abs(y.float().numpy() - ref).max() / np.abs(ref).max()) < 2e-2


@needs_torch
def test_torch_requires_grad_is_refused_with_the_fix(layer):
    x = torch.zeros(4, layer.config.hidden_size, requires_grad=True)
    with pytest.raises(ValueError, match="detach"):
        layer.forward(x)


def test_wrong_dtype(layer):
    with pytest.raises(ValueError, match="float64"):
        layer.forward(x_for(layer).astype(np.float64))
    with pytest.raises(ValueError, match=r"f32 or bf16"):
        layer.forward(np.zeros((2, layer.config.hidden_size), dtype=np.int32))
    with pytest.raises(ValueError, match="bool"):
        layer.forward(np.zeros((2, layer.config.hidden_size), dtype=bool))


def test_wrong_shape(layer):
    D = layer.config.hidden_size
    with pytest.raises(ValueError, match=rf"\[\.\.\., {D}\]"):
        layer.forward(np.zeros((3, D + 1), dtype=np.float32))


def test_not_an_array(layer):
    with pytest.raises(TypeError, match="numpy array or a DLPack tensor"):
        layer.forward([[0.0] * layer.config.hidden_size])
    with pytest.raises(TypeError):
        layer.forward("x")


def test_nan_input_names_the_problem(layer):
    x = x_for(layer)
    x[3, 5] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        layer.forward(x)
    x[3, 5] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        layer.forward(x)


def test_loader_errors():
    with pytest.raises(IndexError, match="outside"):
        moekit.load_moe_layer(str(GOLDENS / "mixtral"), 99)
    with pytest.raises((RuntimeError, ValueError), match="no_such_dir"):
        moekit.load_moe_layer("/no_such_dir", 0)
    with pytest.raises(ValueError, match="dense"):
        moekit.load_moe_layer(str(GOLDENS / "deepseek_v3"), 0)
    with pytest.raises(ValueError):
        moekit.parse_hf_config("{ not json")


def test_set_num_threads_validates():
    n = moekit.num_threads()
    with pytest.raises(ValueError):
        moekit.set_num_threads(-1)
    moekit.set_num_threads(1)
    assert moekit.num_threads() == 1
    moekit.set_num_threads(n)


def test_misaligned_input_is_copied_and_correct(layer):
    D = layer.config.hidden_size
    x = x_for(layer, T=8)
    raw = np.zeros(x.nbytes + 4, dtype=np.uint8)
    shifted = raw[1 : 1 + x.nbytes].view(np.float32).reshape(x.shape)  # 1 byte off: not 4-aligned
    shifted[...] = x
    address, copied = moekit._moekit._input_address(shifted)
    assert copied and shifted.ctypes.data % 4 == 1 and D > 0
    np.testing.assert_array_equal(layer.forward(shifted), layer.forward(x))
