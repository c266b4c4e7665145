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
import socket
import subprocess
import sys
import time

import pytest
from support import child_env  # noqa: E402

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "divergence_cases.py")
MODES = ("lazy", "eager", "opbyop")
CASES = [f"{m}:{c}" for m in MODES for c in ("correct", "extra_op", "extra_collective", "scalar")] + \
    ["lazy:key", "lazy:replicas", "lazy:recorder", "lazy:unchecked", "lazy:slow_compile",
     "eager:sweep", "eager:stop"]
# the cases that end a program, one launch each (started together, short)
ENDS = {"lazy:stop": "lazy:fence,lazy:stop", "opbyop:stop": "opbyop:fence,opbyop:stop",
        "lazy:end": "lazy:end", "lazy:crash": "lazy:crash", "lazy:busy": "lazy:busy"}


def _env(**extra) -> dict:
    # the session's store (conftest) is shared with the processes: they compile the same
    # graphs many times over; XLA_FLAGS off: each case says how many devices it has
    return child_env({"XLANB_STORE_DIR": os.environ.get("XLANB_STORE_DIR", ""),
                      "XLA_FLAGS": None, **extra})


def _line(tag: str) -> str:
    """``divergence_cases.py:N``: the line marked ``# LINE:tag``."""
    with open(SCRIPT) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# LINE:{tag}"):
                return f"divergence_cases.py:{n}"
    raise AssertionError(tag)


def _launch(cases: str, out, port=None, **env) -> subprocess.Popen:
    # --grace: on a loaded machine process 1's watcher may need more than the default 3 s
    # to hear that process 0 gave up on it, and the test reads what it says then
    return subprocess.Popen([sys.executable, "-m", "xlanb.launch", "--nproc", "2",
                             "--devices-per-proc", "2", "--grace", "20",
                             *(["--port", str(port)] if port else []), SCRIPT, cases],
                            stdout=open(out / "out", "w"), stderr=open(out / "err", "w"),
                            text=True, cwd=ROOT, env=_env(**env))


def _results(proc: subprocess.Popen, out, timeout: float) -> dict:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = (out / "out").read_text(), (out / "err").read_text()
    cases: dict = {}
    for m in re.finditer(r"^CASE (\d) (\S+) (.*)$", stdout, re.M):
        # raw_decode: a native library's own print may end up on the same line
        cases.setdefault(m.group(2), {})[int(m.group(1))] = json.JSONDecoder().raw_decode(m.group(3))[0]
    return {"cases": cases, "rc": proc.returncode, "stdout": stdout, "stderr": stderr}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    # a short timeout: the "stop" case waits it out (the default suits a slow compile)
    out = tmp_path_factory.mktemp("divergence")
    return _results(_launch(",".join(CASES), out, XLANB_DIST_TIMEOUT="3"), out, 240)


@pytest.fixture(scope="module")
def ends(tmp_path_factory) -> dict:
    """The launches that end in "stop" (lazy, opbyop) or "end": side by side (most of
    their time is waiting), each case's launch under its name."""
    outs = {name: tmp_path_factory.mktemp(name.replace(":", "_")) for name in ENDS}
    # a coordinator port each, distinct (each launcher's own free port, asked for at the
    # same moment, could be one)
    socks = [socket.socket() for _ in ENDS]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    procs = {name: _launch(cases, outs[name], port, XLANB_DIST_TIMEOUT="3")
             for (name, cases), port in zip(ENDS.items(), ports)}
    return {name: _results(procs[name], outs[name], 240) for name in ENDS}


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
    if mode == "lazy":  # the differ over the two whole graphs, in words for processes
        msg = got[0]["error"]
        assert re.search(r"\d op\(s\) only in process 1, first aten::mul at " + line, msg), msg
        assert re.search(r"the graphs differ \(\d+ ops in process 0, \d+ in process 1\)", msg), msg
        # not a recompile's wording (issue 46, item 17)
        assert "previous graph" not in msg and "graph changed" not in msg and " added" not in msg


def test_extra_collective_shows_the_collectives(run):
    msg = _case(run, "lazy:extra_collective")[0]["error"]
    # process 1's graph reduces two values: its one all-reduce moves 8 bytes, not 4
    assert re.search(r"process 0: graph of \d+ ops \w+ \(1 all-reduce, 4 B\)", msg), msg
    assert re.search(r"process 1: graph of \d+ ops \w+ \(1 all-reduce, 8 B\)", msg), msg


@pytest.mark.parametrize("mode", MODES)
def test_a_process_that_stops_arriving_is_named_and_everyone_exits(run, ends, mode):
    """Process 1 sleeps where process 0 waits for it: process 0 reports it (its last
    run, where its Python is now) after XLANB_DIST_TIMEOUT; both exit with the report;
    the launcher exits non-zero with each process's last lines."""
    if mode != "eager":
        run = ends[f"{mode}:stop"]
    got = run["cases"].get(f"{mode}:stop", {})
    assert 0 in got, f"{got}\n{run['stdout'][-3000:]}\n{run['stderr'][-3000:]}"
    r = got[0]
    assert r["type"] == "MissingProcessError" and r["processes"] == [1], r
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


def test_a_process_that_ends_its_program_early_is_named(ends):
    """Process 1 leaves its program where process 0 runs on: process 0 is told at its
    next multi-process run, at once (no timeout), by process 1's exit entry."""
    run = ends["lazy:end"]
    got = run["cases"].get("lazy:end", {})
    assert 0 in got and 1 not in got, f"{got}\n{run['stdout'][-3000:]}\n{run['stderr'][-3000:]}"
    r = got[0]
    assert r["type"] == "DivergenceError" and r["processes"] == [1], r
    msg = r["error"]
    assert "process 1 ended its program where process 0 goes on" in msg
    assert "process 1: ended its program (after 0 multi-process runs)" in msg
    assert f"process 0: graph of " in msg and _line("end") in msg
    assert run["rc"] == 1  # process 0's error
    assert "did not reach" not in run["stderr"]


def test_a_slow_compile_is_waited_for(run):
    """Process 1 compiles longer than XLANB_DIST_TIMEOUT: process 0 asks where it is,
    finds it compiling and waits again; both get the answer."""
    got = _case(run, "lazy:slow_compile")
    assert "error" not in got[0] and got[0] == got[1]
    assert re.search(r"still waiting for process 1 \(at divergence_cases\.py:\d+ slow, compiling"
                     r"( \([^)]*\))?\); waiting another 3 s \(1 of at most 3 such waits\)",
                     run["stderr"]), run["stderr"][-3000:]


@pytest.mark.parametrize("mode", MODES)
def test_a_python_number_that_differs_is_a_divergence_error(run, mode):
    """Issue 46, item 5: ``lr = 0.1 if rank == 0 else 0.2`` times a sharded sum gave two
    answers. The values of the lifted numbers are agreed on too: both processes raise,
    naming the number's op and line and its value in each process."""
    got = _case(run, f"{mode}:scalar")
    line = _line("scalar")
    thing = "graph" if mode == "lazy" else "op"
    for p in (0, 1):
        r = got[p]
        assert r.get("type") == "DivergenceError" and r["processes"] == [1], r
        msg = r["error"]
        assert f"process 1 would run the same {thing} as process 0 with other Python numbers" in msg
        assert (f"process 1 against process 0: the Python number of aten::mul at {line} scalar: "
                "0.1 in process 0, 0.2 in process 1") in msg, msg
    assert got[0]["error"] == got[1]["error"]


def test_a_random_key_that_differs_is_a_divergence_error(run):
    """Dropout over a sharded tensor after torch.manual_seed(rank): the same graph, other
    random keys (each process would drop other elements of one global array)."""
    got = _case(run, "lazy:key")
    for p in (0, 1):
        msg = got[p]["error"]
        assert got[p]["type"] == "DivergenceError", got[p]
        assert re.search(rf"the random key of aten::native_dropout at {_line('key')} key: \[\d+, \d+\] "
                         r"in process 0, \[\d+, \d+\] in process 1 \(is torch.manual_seed the same",
                         msg), msg


def test_a_crash_is_reported_as_a_crash_with_its_error_and_line(ends):
    """Issue 46, item 17: process 1 ends with an uncaught KeyError where process 0 syncs:
    process 0 raises ProcessCrashError (not "ended its program") with process 1's own
    error and line; each process's traceback comes through with its [i] marks."""
    from xlanb.distributed import DivergenceError, ProcessCrashError
    assert issubclass(ProcessCrashError, DivergenceError)
    run = ends["lazy:crash"]
    got = run["cases"].get("lazy:crash", {})
    assert 0 in got and 1 not in got, f"{got}\n{run['stdout'][-3000:]}\n{run['stderr'][-3000:]}"
    r = got[0]
    assert r["type"] == "ProcessCrashError" and r["processes"] == [1], r
    msg = r["error"]
    assert "process 1 crashed where process 0 goes on" in msg
    assert (f"process 1: crashed with KeyError: 'no such key' at {_line('crash')} crash "
            "(after 0 multi-process runs)") in msg, msg
    assert "process 0: graph of " in msg and _line("crash_sync") in msg
    assert "ended its program" not in msg
    assert run["rc"] == 1
    err = run["stderr"]
    # each process's traceback, each line marked with its process, in order
    assert re.search(r"^\[1\] Traceback \(most recent call last\):$(.|\n)*?"
                     r"^\[1\]     return \{\}\[\"no such key\"\]  # LINE:crash$(.|\n)*?"
                     r"^\[1\] KeyError: 'no such key'$", err, re.M), err[-3000:]
    assert re.search(r"^\[0\] xlanb.distributed.ProcessCrashError: the processes disagree", err, re.M)


def test_a_peer_busy_in_torch_is_waited_for_a_bounded_time(ends):
    """Issue 46, item 8: process 1 loops over F.normalize(F.layer_norm(...)) on the CPU
    and never arrives. Process 0 waits again while it is busy, at most 3 times (it said
    "busy in xlanb's or JAX's own work" for ever), then stops both, naming process 1's
    own line."""
    run = ends["lazy:busy"]
    got = run["cases"].get("lazy:busy", {})
    assert 0 in got, f"{got}\n{run['stdout'][-3000:]}\n{run['stderr'][-3000:]}"
    r = got[0]
    assert r["type"] == "MissingProcessError" and r["processes"] == [1], r
    msg = r["error"]
    line = _line("busy")
    # (on a loaded machine one look may find it idle: then it is named at once)
    assert re.search(r"process 1 did not reach multi-process run #0 within 3 s \(XLANB_DIST_TIMEOUT\)"
                     r"( and [1-3] more such waits? while it was busy)?:", msg), msg
    # its own line; and what it runs there, unless the last look caught it between two
    # torch calls, at the loop's own line (seen once in CI: "now at ...:97 busy")
    assert re.search(rf"process 1 is now at {line} busy( \((running torch's own code|innermost:) "
                     r"\(?functional\.py:\d+ (layer_norm|normalize|norm)|\n)", msg), msg
    err = run["stderr"]
    waits = re.findall(rf"still waiting for process 1 \(at {line} busy, running torch's own code "
                       r"\(functional\.py:\d+ \w+\)\); waiting another 3 s \((\d) of at most 3", err)
    assert len(waits) <= 3 and waits == [str(i + 1) for i in range(len(waits))], err[-3000:]
    assert "xlanb's or JAX's own work" not in err
    assert run["rc"] != 0


def test_flight_recorder(run):
    got = _case(run, "lazy:recorder")
    runs = got[0]["value"]
    assert runs and all(re.match(r"#\d+ \d\d:\d\d:\d\d\.\d{3} ", r) for r in runs)
    assert any("graph of" in r and "1 all-reduce" in r and "[agreed]" in r for r in runs)
    assert any("[diverged]" in r for r in runs)
    assert any(_line("extra_op") in r for r in got[1]["value"])  # process 1's own line
    err = run["stderr"]
    # SIGUSR1 to the launcher, which passes it on: in each process every thread's stack
    # (faulthandler), then the recorder
    for p in (0, 1):
        assert f"xlanb: process {p}'s last multi-process runs (xlanb.distributed.recent()):" in err
    assert re.search(r"Current thread .*\n.*divergence_cases\.py.* in recorder", err)


def test_with_the_check_off_nothing_is_checked(run):
    """XLANB_DIST_CHECK=0 (xlanb.config.dist_check): process 1's extra op runs unseen,
    and the processes have two answers: what the check is there to prevent."""
    got = _case(run, "lazy:unchecked")
    assert "error" not in got[0] and "error" not in got[1], got
    assert got[1]["value"][0] == pytest.approx(2 * got[0]["value"][0], rel=1e-6)
    assert got[1]["value"][1] == got[0]["value"][1]  # the fence after it: both again


def test_sigusr1_handler_installed_with_the_check_off(monkeypatch, capfd):
    """initialize() of several processes installs the recorder's SIGUSR1 handler even
    with XLANB_DIST_CHECK=0, and over an ignored SIGUSR1 (how the launcher starts its
    children), never over the user's own."""
    import faulthandler

    import xlanb
    from xlanb import distributed
    from xlanb.base.session import session
    monkeypatch.setattr(xlanb.config, "dist_check", False)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGUSR1, mine)
        distributed._install()
        assert signal.getsignal(signal.SIGUSR1) is mine
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        distributed._install()
        assert session.agree is None  # the check is off: no exchange, no watcher
        assert signal.getsignal(signal.SIGUSR1) is distributed._on_sigusr1
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.1)
        err = capfd.readouterr().err
        assert "xlanb: process 0's last multi-process runs (xlanb.distributed.recent()): none" in err
        assert "Current thread" in err and "test_sigusr1_handler_installed_with_the_check_off" in err
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, before)


def test_old_runs_leave_the_store(run):
    """The store keeps the keys of the last two blocks of 64 runs, a divergence's
    summaries included (they live under their run's block)."""
    got = _case(run, "eager:sweep")
    s = got[0]["value"]
    assert s["diverged"] and max(s["diverged"]) < s["from"]
    top = s["to"] >> 6  # every run before block top-1 is swept, and nothing else is there
    assert str(top) in s["folders"] and all(f.isdigit() and int(f) >= top - 1 for f in s["folders"]), s


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


def _launch_sleepers(tmp_path, line: str, jax_init: bool = False, *args):
    """Two children under xlanb.launch that write their pids, print ``line`` (Python
    code, in the child) and sleep; returns the launcher and the pids, once both run.
    ``jax_init``: each first joins ``jax.distributed`` (whose preemption notifier then
    catches SIGTERM) and registers an atexit hook that writes ``atexit<i>``."""
    script = tmp_path / "sleeper.py"
    init = ("import atexit, jax\n"
            "jax.distributed.initialize(os.environ['XLANB_COORDINATOR_ADDRESS'], "
            "int(os.environ['XLANB_NUM_PROCESSES']), int(os.environ['XLANB_PROCESS_ID']))\n"
            f"atexit.register(lambda: open(os.path.join({str(tmp_path)!r}, 'atexit' + "
            "os.environ['XLANB_PROCESS_ID']), 'w').write('ran'))\n") if jax_init else ""
    script.write_text("import os, signal, time\n" + init +
                      f"open(os.path.join({str(tmp_path)!r}, 'pid' + os.environ['XLANB_PROCESS_ID']), 'w')"
                      ".write(str(os.getpid()))\n"
                      f"print({line}, flush=True)\ntime.sleep(300)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "xlanb.launch", "--nproc", "2", *args, str(script)],
                                cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"pid{i}").exists() for i in (0, 1)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.1)
        time.sleep(0.3)
        return launcher, [int((tmp_path / f"pid{i}").read_text()) for i in (0, 1)]
    except BaseException:
        launcher.kill()
        raise


def _wait_gone(pids, seconds: float = 30) -> list:
    deadline = time.monotonic() + seconds
    while _pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _pids_alive(pids)


def test_children_die_with_a_launcher_killed_outright(tmp_path):
    """Issue 46, item 9: after jax.distributed.initialize(), JAX's preemption notifier
    catches SIGTERM, so the children of a launcher killed with SIGKILL ran on, with
    parent 1. Their death signal is SIGKILL now."""
    launcher, pids = _launch_sleepers(tmp_path, "'ready'", True)
    try:
        launcher.kill()
        launcher.wait(timeout=30)
        assert not _wait_gone(pids)
    finally:
        for pid in _pids_alive(pids):  # never leave them behind, even on a failure
            os.kill(pid, signal.SIGKILL)


def test_ctrl_c_gives_the_children_a_stated_grace_to_run_atexit_hooks(tmp_path):
    """Issue 46, item 9: Ctrl-C SIGKILLed every child 2 s later (SIGTERM does nothing
    after jax.distributed.initialize()), so no atexit hook ran (XLA_METRICS_FILE's).
    Each child now gets SIGINT, and --stop-grace seconds (said on stderr) to end."""
    launcher, pids = _launch_sleepers(tmp_path, "'ready'", True, "--stop-grace", "60")
    try:
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in _pids_alive(pids):
            os.kill(pid, signal.SIGKILL)
    assert launcher.returncode == 128 + signal.SIGINT, err
    assert ("xlanb.launch: SIGINT: stopping every process: each gets SIGINT (KeyboardInterrupt: "
            "its atexit hooks run) and is killed if still running after 60 s (--stop-grace)") in err
    assert "killing" not in err, err
    for i in (0, 1):
        assert (tmp_path / f"atexit{i}").read_text() == "ran", err
        # its traceback came through whole, each line marked with its process
        assert re.search(rf"^\[{i}\] Traceback \(most recent call last\):\n(\[{i}\] .*\n)*"
                         rf"\[{i}\] KeyboardInterrupt$", err, re.M), err


def test_a_child_that_outlives_the_grace_is_killed_and_named(tmp_path):
    """A child that goes on after SIGINT (it catches KeyboardInterrupt) is killed once
    --stop-grace has passed, and the launcher says which."""
    launcher, pids = _launch_sleepers(
        tmp_path, "signal.signal(signal.SIGINT, signal.SIG_IGN) if os.environ['XLANB_PROCESS_ID'] == '1' "
        "else 'ready'", False, "--stop-grace", "1")
    try:
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM
    assert "xlanb.launch: still running after 1 s: killing process 1 (SIGKILL)" in err, err
    assert "[1] --- process 1 (killed by SIGKILL) ---" in err
    assert "[0] --- process 0 (exit status 1) ---" in err or "(killed by SIGINT)" in err, err
    assert not _wait_gone(pids, 10)


def test_launcher_stops_its_children_on_sigterm(tmp_path):
    launcher, pids = _launch_sleepers(tmp_path, "'ready'")
    try:
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


def test_launcher_passes_sigusr1_on_and_stops_everyone_on_sigint(tmp_path):
    """SIGUSR1 to the launcher goes to every child, which starts with it ignored: a child
    with no handler of its own (before xlanb.distributed.initialize(), or none at all)
    lives on. SIGINT then stops every child: exit status 130."""
    launcher, pids = _launch_sleepers(
        tmp_path, "'SIGUSR1 ignored:', signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN")
    try:
        launcher.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert launcher.poll() is None  # no child died of it (the launcher would end)
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGINT, err
    assert "SIGINT: stopping every process" in err
    assert "killed by SIGUSR1" not in err
    assert "[0] SIGUSR1 ignored: True" in err and "[1] SIGUSR1 ignored: True" in err
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



def test_a_peer_busy_in_xlanb_or_jax_is_working_a_sleeping_one_is_not():
    """What the watcher tells a waiting process: a main thread whose CPU time grows in
    xlanb's, JAX's or torch's own code (a slow trace or lowering on a loaded machine) is
    waited for again, as a compiling one is; one asleep there, one in the user's own code
    and one in this module's own waits are not."""
    import threading
    import traceback

    import jax

    from xlanb import distributed

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    busy = threading.Thread(target=spin, daemon=True)
    idle = threading.Thread(target=stop.wait, daemon=True)
    busy.start(), idle.start()
    try:
        in_jax = traceback.FrameSummary(jax.__file__, 1, "trace")
        in_user = traceback.FrameSummary(__file__, 1, "step")
        in_waits = traceback.FrameSummary(distributed.__file__, 1, "_wait")
        assert distributed._working(in_jax, busy.ident)
        assert not distributed._working(in_jax, idle.ident)
        assert not distributed._working(in_user, busy.ident)
        assert not distributed._working(in_waits, busy.ident)
    finally:
        stop.set()


def test_launcher_refuses_zero_devices_per_process(capsys):
    """Issue 46 (low): --devices-per-proc 0 was ignored (each process got JAX's default)."""
    from xlanb import launch
    with pytest.raises(SystemExit) as e:
        launch.main(["--nproc", "2", "--devices-per-proc", "0", "never_started.py"])
    assert e.value.code == 2
    assert "--devices-per-proc must be at least 1 (got 0)" in capsys.readouterr().err


def test_launcher_keeps_a_burst_of_one_process_together(monkeypatch):
    """Issue 46, item 17: two processes' tracebacks came through interleaved line by line.
    The launcher passes a burst of one process's lines (written one by one, as a
    traceback is) on together, its stderr lines marked [i]."""
    import io
    import types

    from xlanb import launch
    err = io.TextIOWrapper(io.BytesIO())
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
    pipes = [os.pipe() for _ in range(4)]
    procs = [types.SimpleNamespace(stdout=os.fdopen(pipes[2 * i][0], "rb"),
                                   stderr=os.fdopen(pipes[2 * i + 1][0], "rb")) for i in (0, 1)]
    children = [launch._Child(i, procs[i], prefix_err=True) for i in (0, 1)]
    for c in children:
        c.start()
    w0, w1 = pipes[1][1], pipes[3][1]
    for k in range(6):  # one write per line, 10 ms apart: one burst
        os.write(w0, f"line {k}\n".encode())
        if k == 2:
            os.write(w1, b"other\n")
        time.sleep(0.01)
    for _, w in pipes:
        os.close(w)
    for c in children:
        for r in c.readers:
            r.join(timeout=30)
    text = err.buffer.getvalue().decode()
    assert "".join(f"[0] line {k}\n" for k in range(6)) in text, text
    assert "[1] other\n" in text
    assert children[0].last_lines()[-1] == "[0] line 5"


def test_the_scalars_digest_sees_every_value():
    """What each process publishes for a run's lifted numbers and random keys: equal
    values, equal digests; any one value changed (a key, a complex number), another."""
    import numpy as np

    from xlanb.distributed import _scalars_digest
    key = np.array([1, 2], dtype=np.uint32)
    base = [0.1, 2, key, 1e-8]
    assert _scalars_digest([]) == "" and len(_scalars_digest(base, (2,))) == 16
    assert _scalars_digest(base, (2,)) == _scalars_digest([0.1, 2, key.copy(), 1e-8], (2,))
    assert _scalars_digest([0.1, 2, np.array([1, 3], dtype=np.uint32), 1e-8], (2,)) != \
        _scalars_digest(base, (2,))
    assert _scalars_digest([0.2, 2, key, 1e-8], (2,)) != _scalars_digest(base, (2,))
    assert _scalars_digest([float("nan")]) == _scalars_digest([float("nan")])
    assert _scalars_digest([1j, 0.5]) != _scalars_digest([2j, 0.5])
