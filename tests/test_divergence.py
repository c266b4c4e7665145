"""Processes that disagree (issue 33): two processes x two CPU devices of one SPMD
program under ``python -m xlanb.launch``, where process 1 records an extra op, an extra
collective, or stops arriving; and a correct program. Every divergent case must end
with an error naming process 1 and the line, in every mode, never a hang or two
answers. One launch runs every case (tests/scripts/divergence_cases.py); subprocess
timeouts catch a hang. No test here asserts a speed."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "divergence_cases.py")
MODES = ("lazy", "eager", "opbyop")
CASES = [f"{m}:{c}" for m in MODES for c in ("correct", "extra_op", "extra_collective")] + \
    ["lazy:replicas", "lazy:recorder", "lazy:slow_compile", "eager:stop"]


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLANB_MODE", None)
    env.pop("XLA_FLAGS", None)
    env.update(extra)
    return env


def _line(tag: str) -> str:
    """``divergence_cases.py:N``: the line marked ``# LINE:tag``."""
    with open(SCRIPT) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# LINE:{tag}"):
                return f"divergence_cases.py:{n}"
    raise AssertionError(tag)


@pytest.fixture(scope="module")
def run() -> dict:
    # a short timeout: the "stop" case waits it out (the default suits a slow compile).
    # --grace: on a loaded machine process 1's watcher may need more than the default 3 s
    # to hear that process 0 gave up on it, and the test reads what it says then
    proc = subprocess.run([sys.executable, "-m", "xlanb.launch", "--nproc", "2",
                           "--devices-per-proc", "2", "--grace", "20", SCRIPT, ",".join(CASES)],
                          capture_output=True, text=True, cwd=ROOT, timeout=240,
                          env=_env(XLANB_DIST_TIMEOUT="3"))
    cases: dict = {}
    for m in re.finditer(r"^CASE (\d) (\S+) (.*)$", proc.stdout, re.M):
        # raw_decode: a native library's own print may end up on the same line
        cases.setdefault(m.group(2), {})[int(m.group(1))] = json.JSONDecoder().raw_decode(m.group(3))[0]
    return {"cases": cases, "rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def _case(run, name) -> dict:
    got = run["cases"].get(name, {})
    assert set(got) == {0, 1}, f"{name}: {got}\n{run['stdout'][-3000:]}\n{run['stderr'][-3000:]}"
    return got


@pytest.mark.parametrize("mode", MODES)
def test_correct_program_same_answer_everywhere(run, mode):
    got = _case(run, f"{mode}:correct")
    import torch
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 4, generator=g), torch.randn(4, 3, generator=g)
    want = float((x @ w).sum())
    for p in (0, 1):
        assert "error" not in got[p], got[p]
        assert got[p]["value"][0] == pytest.approx(want, rel=1e-5)
    assert got[0] == got[1]


@pytest.mark.parametrize("case", ["extra_op", "extra_collective"])
@pytest.mark.parametrize("mode", MODES)
def test_extra_work_in_one_process_is_a_divergence_error(run, mode, case):
    """Both processes raise DivergenceError before anything runs (no second answer, no
    hang): it names process 1, the first differing op and the line of process 1's
    extra op."""
    got = _case(run, f"{mode}:{case}")
    line = _line(case)
    for p in (0, 1):
        r = got[p]
        assert r.get("type") == "DivergenceError", r
        assert r["processes"] == [1]
        msg = r["error"]
        assert "process 1 would run something else than process 0" in msg
        assert "process 1 against process 0:" in msg and "aten::mul" in msg
        assert line in msg, msg
    assert got[0]["error"] == got[1]["error"]  # one report, the same in every process
    if mode == "lazy":  # the differ over the two whole graphs
        assert "op(s) added, first aten::mul at " + line in got[0]["error"]


def test_extra_collective_shows_the_collectives(run):
    msg = _case(run, "lazy:extra_collective")[0]["error"]
    # process 1's graph reduces two values: its one all-reduce moves 8 bytes, not 4
    assert re.search(r"process 0: graph of \d+ ops \w+ \(1 all-reduce, 4 B\)", msg), msg
    assert re.search(r"process 1: graph of \d+ ops \w+ \(1 all-reduce, 8 B\)", msg), msg


def test_a_process_that_stops_arriving_is_named_and_everyone_exits(run):
    """Process 1 sleeps where process 0 waits for it: process 0 reports it (its last
    run, where its Python is now) after XLANB_DIST_TIMEOUT; both exit with the report;
    the launcher exits non-zero with each process's last lines."""
    got = run["cases"]["eager:stop"]
    r = got[0]
    assert r["type"] == "MissingProcessError" and r["processes"] == [1]
    msg = r["error"]
    assert "process 1 did not reach multi-process run #" in msg
    assert "process 1's last multi-process run: #" in msg
    assert f"process 1 is now at {_line('stop')} stop" in msg
    assert 1 not in got  # process 1 never got there: its watcher stopped it
    assert run["rc"] != 0
    err = run["stderr"]
    assert "xlanb: process 1 stops: another process waited for it in vain." in err
    assert re.search(r"^\[1\] .*process 1 is now at divergence_cases\.py", err, re.M)
    assert re.search(r"^\[0\] .*MissingProcessError", err, re.M)


def test_a_slow_compile_is_waited_for(run):
    """Process 1 compiles longer than XLANB_DIST_TIMEOUT: process 0 asks where it is,
    finds it compiling and waits again; both get the answer."""
    got = _case(run, "lazy:slow_compile")
    assert "error" not in got[0] and got[0] == got[1]
    assert re.search(r"still waiting for process 1 \(divergence_cases\.py:\d+ slow\), which is "
                     r"compiling; waiting another 3 s", run["stderr"]), run["stderr"][-3000:]


def test_flight_recorder(run):
    got = _case(run, "lazy:recorder")
    runs = got[0]["value"]
    assert runs and all(re.match(r"#\d+ \d\d:\d\d:\d\d\.\d{3} ", r) for r in runs)
    assert any("graph of" in r and "1 all-reduce" in r and "[agreed]" in r for r in runs)
    assert any("[diverged]" in r for r in runs)
    assert any(_line("extra_op") in r for r in got[1]["value"])  # process 1's own line
    err = run["stderr"]
    assert "xlanb: process 0's last multi-process runs (xlanb.distributed.recent()):" in err
    # SIGUSR1: every thread's stack (faulthandler), then the recorder
    assert re.search(r"Current thread .*\n.*divergence_cases\.py.* in recorder", err)


def test_replicas_from_different_seeds_name_the_odd_process(run):
    got = _case(run, "lazy:replicas")
    for p in (0, 1):  # both processes see every device's copy
        (index, devices, odd, odd_processes), = got[p]["value"]
        assert devices == ["xla:0", "xla:1", "xla:2", "xla:3"]
        assert odd == ["xla:2", "xla:3"] and odd_processes == [1]


def _pids_alive(pids) -> list:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def test_launcher_stops_its_children_on_sigterm(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\n"
                      f"open(os.path.join({str(tmp_path)!r}, 'pid' + os.environ['XLANB_PROCESS_ID']), 'w')"
                      ".write(str(os.getpid()))\n"
                      "print('ready', flush=True)\ntime.sleep(300)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "xlanb.launch", "--nproc", "2", str(script)],
                                cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"pid{i}").exists() for i in (0, 1)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.1)
        time.sleep(0.3)
        pids = [int((tmp_path / f"pid{i}").read_text()) for i in (0, 1)]
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM
    assert "SIGTERM: stopping every process" in err
    assert "[0] ready" in err and "[1] ready" in err  # each one's last lines, by index
    deadline = time.monotonic() + 10
    while _pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pids_alive(pids)


def test_launcher_stops_the_others_when_one_fails(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, sys, time\nprint('working', flush=True)\n"
                   "if os.environ['XLANB_PROCESS_ID'] == '1':\n"
                   "    print('it went wrong', file=sys.stderr); sys.exit(3)\n"
                   "time.sleep(300)\n")
    proc = subprocess.run([sys.executable, "-m", "xlanb.launch", "--nproc", "2", "--grace", "0.5",
                           str(bad)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3
    assert "process 1 failed (exit status 3): stopping the others" in proc.stderr
    assert "[1] it went wrong" in proc.stderr and "[0] working" in proc.stderr
