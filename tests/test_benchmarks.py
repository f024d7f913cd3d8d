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


def test_bench_row_update_runs():
    script = os.path.join(ROOT, "benchmarks", "bench_row_update.py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, script, "--rows", "200", "--width", "8",
                           "--threads", "1", "--repeat", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    shares = [line for line in lines if len(line) == 3 and line[0].startswith("0.")]
    assert len(shares) == 2 * 8, done.stdout  # a row per share, for both kinds


def test_bench_optimisers_runs():
    script = os.path.join(ROOT, "benchmarks", "bench_optimisers.py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, script, "--users", "60", "--items", "40",
                           "--ratings", "800", "--epochs", "2", "--hidden", "4",
                           "--adam-lrs", "1e-3", "--lrs", "3e-3"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines()[2:] if line.split()]
    assert names == ["adam-0.001", "in-backward-adam-0.001", "rowwise-adagrad-0.003"], \
        done.stdout
