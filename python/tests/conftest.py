"""Shared fixtures: the repository's golden layers (tests/goldens/layers, written by
tools/gen_layer_goldens.py and tools/gen_grad_goldens.py) and optional imports."""

import json
import os
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(os.environ.get("MOEKIT_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
GOLDENS = ROOT / "tests" / "goldens" / "layers"


def cases():
    with open(GOLDENS / "manifest.json") as f:
        return json.load(f)["cases"]


def case_ids():
    return [c["name"] for c in cases()]


@pytest.fixture(params=cases(), ids=case_ids())
def case(request):
    c = dict(request.param)
    d = GOLDENS / c["dir"]
    c["path"] = str(d)
    c["x"] = np.load(d / "input.npy")
    c["y"] = np.load(d / "output.npy")
    c["ids"] = np.load(d / "ids.npy")
    c["weights"] = np.load(d / "weights.npy")
    return c


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# ctest shows a test file whose every test was skipped (torch, transformers or mlx not installed)
# as skipped, not passed: the session then exits with 77, the SKIP_RETURN_CODE python/CMakeLists.txt
# sets.
SKIPPED_ALL = 77
_outcomes = {"passed": 0, "skipped": 0}


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _outcomes["passed"] += 1
    elif report.skipped:
        _outcomes["skipped"] += 1


def pytest_collectreport(report):
    if report.skipped:  # a module skipped as a whole (pytest.importorskip / allow_module_level)
        _outcomes["skipped"] += 1


def pytest_sessionfinish(session, exitstatus):
    # 5: nothing collected, which a module skipped as a whole also gives; with no skip it stays a
    # failure.
    if exitstatus in (0, 5) and _outcomes["passed"] == 0 and _outcomes["skipped"] > 0:
        session.exitstatus = SKIPPED_ALL
