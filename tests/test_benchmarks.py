"""The benchmark scripts still run: every configuration of bench_autoencoder on a tiny shape.

Timings are not checked (never in a test); a configuration that raises
prints ``failed`` in its row, which is what this catches.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_autoencoder_every_configuration_runs():
    script = os.path.join(ROOT, "benchmarks", "bench_autoencoder.py")
    configs = ["dense-masked", "nns-default", "nns-lazyadam", "nns-in-backward",
               "nns-rowwise-adagrad"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, script, "--shape", "tiny", "--steps", "1",
                           "--warmup", "1", "--threads", "1", "--configs", *configs],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()
            if line.split() and line.split()[0] in configs}
    assert set(rows) == set(configs), done.stdout
    failed = [line for line in rows.values() if "failed" in line]
    assert not failed, done.stdout
