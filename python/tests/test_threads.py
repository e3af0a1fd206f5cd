"""Forwards from several Python threads at once (the GIL released inside) give the serial bits;
set_num_threads and pack_weights wait for forwards in flight."""

import threading

import numpy as np

import moekit
from conftest import GOLDENS


def test_concurrent_forwards_are_identical():
    layer = moekit.load_moe_layer(str(GOLDENS / "deepseek_v3"), 1)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((48, layer.config.hidden_size), dtype=np.float32) for _ in range(8)]
    serial = [layer.forward(x) for x in xs]
    results = [[None] * len(xs) for _ in range(4)]
    errors = []

    def work(slot):
        try:
            for _ in range(5):
                for i, x in enumerate(xs):
                    results[slot][i] = layer.forward(x)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    # Meanwhile: change the thread count (waits for forwards in flight) and back.
    n = moekit.num_threads()
    moekit.set_num_threads(1)
    moekit.set_num_threads(n)
    for t in threads:
        t.join()
    assert not errors, errors
    for slot in results:
        for got, want in zip(slot, serial):
            np.testing.assert_array_equal(got, want)


def test_forward_releases_the_gil():
    layer = moekit.load_moe_layer(str(GOLDENS / "mixtral"), 1)
    x = np.random.default_rng(6).standard_normal((1 << 16, layer.config.hidden_size), dtype=np.float32)
    state = {"in_flight": False, "done": False}

    def work():
        state["in_flight"] = True
        layer.forward(x)
        state["in_flight"] = False
        state["done"] = True

    t = threading.Thread(target=work)
    t.start()
    ticks = 0
    while not state["done"]:
        if state["in_flight"]:
            ticks += 1  # runs only if the forward let go of the GIL
    t.join()
    assert ticks > 1000
