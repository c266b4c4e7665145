"""The "Python 3 (xlanb)" Jupyter kernel: install, list, start through jupyter_client, run
magics and tensor ops, uninstall.

Everything is installed under a temporary prefix (or a temporary Jupyter data dir for
--user), so the machine's own kernels are never touched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

from xlanb.kernel import spec  # noqa: E402
from xlanb.kernel.__main__ import main as kernel_main  # noqa: E402
from support import child_env  # noqa: E402

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)


def _env(**extra) -> dict:
    return child_env(extra)


def cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xlanb.kernel", *args], capture_output=True,
                          text=True, env=env or _env(), timeout=120)


def test_kernel_json():
    ks = spec.kernel_json()
    assert ks["display_name"] == "Python 3 (xlanb)"
    assert ks["argv"][1:] == ["-m", "xlanb.kernel", "launch", "-f", "{connection_file}"]
    assert ks["language"] == "python" and "env" not in ks
    ks = spec.kernel_json(mode="eager")
    assert ks["env"] == {"XLANB_MODE": "eager"} and "eager" in ks["display_name"]
    with pytest.raises(ValueError, match="valid modes are"):
        spec.kernel_json(mode="fast")


def test_install_list_uninstall_cli(tmp_path, capsys):
    prefix = str(tmp_path / "env")
    env = _env(JUPYTER_PATH=os.path.join(prefix, "share", "jupyter"))
    res = cli("install", "--prefix", prefix, "--name", "xlanb-test", "--mode", "opbyop", env=env)
    assert res.returncode == 0, res.stderr
    kdir = os.path.join(prefix, "share", "jupyter", "kernels", "xlanb-test")
    with open(os.path.join(kdir, "kernel.json")) as f:
        ks = json.load(f)
    assert ks["env"] == {"XLANB_MODE": "opbyop"} and ks["argv"][0] == sys.executable
    listed = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert "xlanb-test" in listed.stdout, listed.stdout + listed.stderr
    # the rest in-process (each `python -m xlanb.kernel` imports torch and jax)
    assert kernel_main(["uninstall", "--prefix", prefix, "--name", "xlanb-test"]) == 0
    assert not os.path.exists(kdir)
    assert kernel_main(["uninstall", "--prefix", prefix, "--name", "xlanb-test"]) == 1
    assert "no kernel spec named 'xlanb-test'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_main(["install", "--prefix", prefix, "--mode", "fast"])
    assert "invalid choice" in capsys.readouterr().err


def test_install_user_and_sys_prefix_locations(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    path = spec.install("xlanb-user-test", user=True)
    assert path.startswith(str(tmp_path / "data"))
    assert spec.spec_dir("xlanb-user-test", user=True) == path
    assert spec.uninstall("xlanb-user-test", user=True) == path
    assert not os.path.exists(path)
    with pytest.raises(SystemExit):  # the location options exclude each other
        kernel_main(["install", "--sys-prefix", "--prefix", "x"])


@pytest.fixture(scope="module")
def kernel_dirs(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("kernels"))
    spec.install("xlanb-test", prefix=prefix)
    return [os.path.join(prefix, "share", "jupyter", "kernels")]


def _execute(kc, code: str, timeout: float = 120):
    """Run ``code``; return (reply content, stdout text, rich outputs, errors)."""
    msgs = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=msgs.append)
    stdout = "".join(m["content"]["text"] for m in msgs
                     if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
    rich = [m["content"]["data"] for m in msgs if m["msg_type"] in ("display_data", "execute_result")]
    errors = [m["content"] for m in msgs if m["msg_type"] == "error"] + \
        [m["content"]["text"] for m in msgs
         if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"]
    return reply["content"], stdout, rich, errors


@pytest.fixture
def start_kernel(kernel_dirs):
    started = []

    def start(**env):
        km = KernelManager(kernel_name="xlanb-test",
                           kernel_spec_manager=KernelSpecManager(kernel_dirs=kernel_dirs))
        km.start_kernel(env=_env(PYTHONWARNINGS="ignore", **env))
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        started.append((km, kc))
        return kc
    yield start
    for km, kc in started:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_kernel_runs_magics_and_tensor_ops(start_kernel):
    kc = start_kernel()
    reply, out, _, _ = _execute(kc, "import xlanb\nprint('mode', xlanb.get_mode())\n"
                                    "print(sorted(get_ipython().magics_manager.magics['line']))")
    assert reply["status"] == "ok"
    assert "mode lazy" in out and "'xla_pending'" in out  # the extension is loaded
    reply, out, _, _ = _execute(kc, "import faulthandler\nprint('fh', faulthandler.is_enabled())")
    assert "fh True" in out  # a native crash leaves the Python stacks in the kernel's log
    reply, out, _, _ = _execute(kc, "%xla_mode eager")
    assert reply["status"] == "ok" and "lazy -> eager" in out
    reply, out, rich, _ = _execute(
        kc, "import torch\nx = torch.arange(6.0, device='xla').reshape(2, 3)\n"
            "print((x * 2).sum().item(), xlanb.get_mode(), "
            "sum(xlanb.metrics.counter_value(c) or 0 for c in "
            "('OpCompile', 'EagerRunCompile')) > 0)\nx")  # a run of new ops compiles once
    assert reply["status"] == "ok"
    assert "30.0 eager True" in out
    (bundle,) = rich
    assert "device='xla:0'" in bundle["text/plain"] and "xla:0" in bundle["text/html"]
    reply, _, _, errors = _execute(kc, "%xla_mode fast")
    assert reply["status"] == "error"
    assert any("valid modes are" in str(e) for e in errors)
    reply, out, _, _ = _execute(kc, "%xla_mode lazy\n%xla_status on\ny = x + 1")
    assert reply["status"] == "ok" and "xla: lazy · 1 pending op" in out
    reply, _, rich, _ = _execute(kc, "%xla_sync")
    assert reply["status"] == "ok" and "new compile" in rich[0]["text/plain"]


def test_kernel_mode_from_environment(start_kernel):
    kc = start_kernel(XLANB_MODE="opbyop")
    reply, out, _, _ = _execute(kc, "%xla_mode")
    assert reply["status"] == "ok" and "xla mode: opbyop" in out
