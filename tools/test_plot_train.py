#!/usr/bin/env python3
"""Self-test for tools/plot_train.py:  /usr/bin/python3 tools/test_plot_train.py

Writes small synthetic train.csv / load.csv / bias.csv files (2 layers, 8 experts, 300 steps,
eval every 50 steps, eval cells empty otherwise) into a temp dir and runs the script the way
moekit does: `/usr/bin/python3 - <args>` with the script text on stdin. Checks that every
expected PNG is written and is a PNG, that compare mode works, and that bad input exits 2 with
`plot_train.py: error:` on stderr and no traceback. Skipped if matplotlib is not importable.
"""
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "plot_train.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
PNG_SIG = b"\x89PNG\r\n\x1a\n"
L, E, STEPS, EVAL_EVERY = 2, 8, 300, 50


def have_matplotlib():
    r = subprocess.run([PYTHON, "-c", "import matplotlib, numpy"], capture_output=True)
    return r.returncode == 0


def write_train(path, seed=0, drop=None, corrupt=None):
    """Synthetic train.csv; `drop` removes a column, `corrupt` = (line, column, text)."""
    rng = random.Random(seed)
    cols = ("step,tokens,train_loss,eval_loss,eval_ppl,eval_bpb,maxvio_batch,maxvio_global,"
            "dead_experts,aux_loss,z_loss,lr,bias_rate,bias_min,bias_max,grad_norm,tokens_per_s"
            ).split(",")
    cols += [f"{k}_l{l}" for k in ("maxvio_batch", "maxvio_global", "dead_experts")
             for l in range(L)]
    rows = []
    for s in range(1, STEPS + 1):
        ev = s % EVAL_EVERY == 0
        loss = 2.0 + 3.0 * math.exp(-s / 80) + rng.uniform(-0.1, 0.1)
        mvb = [2.0 * math.exp(-s / 60) + rng.uniform(0, 0.05) for _ in range(L)]
        mvb[0] = 0.0 if s > 250 else mvb[0]  # zeros must survive the log-scale clipping
        mvg = [v / 2 for v in mvb]
        el = loss + 0.05
        r = {"step": s, "tokens": s * 4096, "train_loss": loss, "eval_loss": el if ev else "",
             "eval_ppl": math.exp(el) if ev else "", "eval_bpb": el / math.log(2) / 4 if ev else "",
             "maxvio_batch": max(mvb), "maxvio_global": max(mvg) if ev else "",
             "dead_experts": 0, "aux_loss": 0.01, "z_loss": 0.001, "lr": 1e-3,
             "bias_rate": 1e-3, "bias_min": -0.1, "bias_max": 0.1, "grad_norm": 1.0,
             "tokens_per_s": 1e5}
        for l in range(L):
            r[f"maxvio_batch_l{l}"], r[f"dead_experts_l{l}"] = mvb[l], 0
            r[f"maxvio_global_l{l}"] = mvg[l] if ev else ""
        rows.append(r)
    if drop:
        cols.remove(drop)
    lines = [",".join(cols)] + [",".join(str(r[c]) for c in cols) for r in rows]
    if corrupt:
        line, col, text = corrupt
        fields = lines[line - 1].split(",")
        fields[cols.index(col)] = text
        lines[line - 1] = ",".join(fields)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_per_expert(path, kind, seed=1):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write("step,layer," + ",".join(f"e{i}" for i in range(E)) + "\n")
        for s in range(1, STEPS + 1):
            for l in range(L):
                if kind == "load":
                    v = [max(0.0, 1 + (i - 3.5) / 3 * math.exp(-s / 70) + rng.uniform(-.1, .1))
                         for i in range(E)]
                    if l == 1:
                        v[7] = 0.0  # a dead expert
                    v = [x * E / sum(v) for x in v]
                else:
                    v = [0.01 * (3.5 - i) * (1 - math.exp(-s / 50)) for i in range(E)]
                f.write(f"{s},{l}," + ",".join(f"{x:.6g}" for x in v) + "\n")


@unittest.skipUnless(have_matplotlib(),
                     f"matplotlib/numpy not importable by {PYTHON} "
                     "(Debian: apt-get install python3-matplotlib)")
class PlotTrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(SCRIPT, "rb") as f:
            cls.script = f.read()
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.d = cls.tmp.name
        write_train(os.path.join(d, "train.csv"))
        write_train(os.path.join(d, "train_b.csv"), seed=5)
        write_per_expert(os.path.join(d, "load.csv"), "load")
        write_per_expert(os.path.join(d, "bias.csv"), "bias")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def p(self, name):
        return os.path.join(self.d, name)

    def plot(self, *args):
        """Run the script as moekit does: script text on stdin, `python3 - args`."""
        return subprocess.run([PYTHON, "-", *args], input=self.script, capture_output=True,
                              cwd=self.d, timeout=120)

    def assert_png(self, path):
        self.assertTrue(os.path.isfile(path), f"{path} not written")
        with open(path, "rb") as f:
            self.assertEqual(f.read(8), PNG_SIG, f"{path} is not a PNG")

    def assert_input_error(self, r, *needles):
        err = r.stderr.decode()
        self.assertEqual(r.returncode, 2, err)
        self.assertIn("plot_train.py: error:", err)
        self.assertNotIn("Traceback", err)
        for n in needles:
            self.assertIn(n, err)

    def test_run(self):
        out = self.p("out_run")
        r = self.plot("run", "--csv", self.p("train.csv"), "--load", self.p("load.csv"),
                      "--bias", self.p("bias.csv"), "--out", out, "--title", "self-test")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        names = ["loss.png", "maxvio.png", "load_l0.png", "load_l1.png", "bias.png"]
        for n in names:
            self.assert_png(os.path.join(out, n))
            self.assertIn(f"wrote {os.path.join(out, n)}", r.stdout.decode())
        self.assertEqual(sorted(os.listdir(out)), sorted(names))

    def test_compare(self):
        out = self.p("cmp.png")
        args = ("compare", "--out", out, "--smooth", "10",
                f"A={self.p('train.csv')}", f"B={self.p('train_b.csv')}")
        r = self.plot(*args)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(r.stdout.decode().strip(), f"wrote {out}")
        self.assert_png(out)
        with open(out, "rb") as f:
            first = f.read()
        self.assertEqual(self.plot(*args).returncode, 0)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), first, "output is not deterministic")

    def test_missing_column(self):
        write_train(self.p("nocol.csv"), drop="train_loss")
        r = self.plot("run", "--csv", self.p("nocol.csv"), "--load", self.p("load.csv"),
                      "--out", self.p("o1"))
        self.assert_input_error(r, "nocol.csv", "train_loss")
        self.assertFalse(os.path.exists(self.p("o1")))

    def test_missing_file(self):
        r = self.plot("run", "--csv", self.p("train.csv"), "--load", self.p("absent.csv"),
                      "--out", self.p("o2"))
        self.assert_input_error(r, "absent.csv")
        r = self.plot("compare", "--out", self.p("c.png"), f"X={self.p('absent.csv')}")
        self.assert_input_error(r, "absent.csv")

    def test_not_a_number(self):
        write_train(self.p("bad.csv"), corrupt=(7, "grad_norm", "1.2.3"))
        r = self.plot("compare", "--out", self.p("c.png"), f"X={self.p('bad.csv')}")
        self.assert_input_error(r, "bad.csv", "line 7", "grad_norm", "1.2.3")

    def test_no_rows(self):
        with open(self.p("train.csv")) as f, open(self.p("empty.csv"), "w") as g:
            g.write(f.readline())
        r = self.plot("compare", "--out", self.p("c.png"), f"X={self.p('empty.csv')}")
        self.assert_input_error(r, "empty.csv", "no data rows")

    def test_help(self):
        r = self.plot("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("compare", r.stdout.decode())


# Exit status 77 (ctest's SKIP_RETURN_CODE for this test) when every test was skipped, so a run
# without matplotlib shows as skipped rather than passed.
SKIPPED_ALL = 77

if __name__ == "__main__":
    result = unittest.main(verbosity=2, exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.testsRun > 0 and len(result.skipped) == result.testsRun:
        sys.exit(SKIPPED_ALL)
