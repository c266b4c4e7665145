"""Every XLANB_* setting is checked in one place, ``Config`` (issue 37, item 4): a bad value
is a SettingError (a ValueError) that names the variable, its value and what it takes,
before anything runs. Before, XLANB_MAX_EXECUTABLES=-1 was accepted and every op then failed
with "generator raised StopIteration", and XLANB_MAX_EXECUTABLES=abc failed ``import
xlanb`` with "invalid literal for int() with base 10: 'abc'"."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import xlanb
from conftest import _child_env
from xlanb.base.config import Config, SettingError

BAD = [
    ("XLANB_MAX_EXECUTABLES", "-1", "whole number >= 0"),
    ("XLANB_MAX_EXECUTABLES", "abc", "whole number >= 0"),
    ("XLANB_MAX_GRAPHS", "-5", "whole number >= 1"),
    ("XLANB_MAX_GRAPHS", "1.5", "whole number >= 1"),
    ("XLANB_MAX_GRAPHS", "0", "whole number >= 1"),
    ("XLANB_PEEK_CACHE_BYTES", "-1", "size in bytes >= 0"),
    ("XLANB_PEEK_CACHE_BYTES", "abc", "size in bytes >= 0"),
    ("XLANB_MEMORY_LINE_BYTES", "lots", "size in bytes >= 0"),
    ("XLANB_MEMORY_LIMIT", "-3G", "size in bytes > 0"),
    ("XLANB_STORE_MAX_BYTES", "0", "size in bytes > 0"),
    ("XLANB_MODE", "fast", "one of lazy, eager, opbyop"),
    ("XLANB_INSPECT", "all", "one of peek, sync, meta"),
    ("XLANB_PLATFORM", "quantum", "one of cpu, gpu"),
    ("XLANB_DEBUG", "maybe", "1 or 0"),
    ("XLANB_DEBUG_NANS", "2", "1 or 0"),
    ("XLANB_BACKGROUND_COMPILE", "off please", "1 or 0"),
    ("XLANB_QUICK_PEEKS", "-1", "1 or 0"),
    ("XLANB_EAGER_RUNS", "many", "whole number >= 0"),
    ("XLANB_TIER_UP", "-2", "whole number >= 0"),
    ("XLANB_QUICK_COMPILES", "fast", "1 or 0"),
    ("XLANB_CHECK_DEVICE_INDICES", "sometimes", "1 or 0"),
    ("XLANB_NUM_PROCESSES", "0", "whole number >= 1"),
    ("XLANB_PROCESS_ID", "-1", "whole number >= 0"),
    ("XLANB_COORDINATOR_ADDRESS", "localhost", "host:port"),
]


@pytest.mark.parametrize("name,value,accepts", BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_setting_names_the_variable_its_value_and_what_it_takes(monkeypatch, name,
                                                                      value, accepts):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as e:
        Config()
    msg = str(e.value)
    assert msg.startswith(f"{name}={value!r} is not valid") and accepts in msg, msg
    assert isinstance(e.value, ValueError)


def test_good_settings_are_read(monkeypatch):
    for name, value in [("XLANB_MAX_EXECUTABLES", "300"), ("XLANB_MAX_GRAPHS", "12"),
                        ("XLANB_PEEK_CACHE_BYTES", "0"), ("XLANB_MEMORY_LINE_BYTES", "1M"),
                        ("XLANB_MEMORY_LIMIT", "1.5G"), ("XLANB_DEBUG", "true"),
                        ("XLANB_BACKGROUND_COMPILE", "0"), ("XLANB_MODE", "Eager"),
                        ("XLANB_PLATFORM", "cpu"), ("XLANB_COORDINATOR_ADDRESS", "10.0.0.1:8476")]:
        monkeypatch.setenv(name, value)
    c = Config()
    assert (c.max_executables, c.max_graphs, c.peek_cache_bytes, c.memory_line_bytes) == \
        (300, 12, 0, 1 << 20)
    assert c.memory_limit == int(1.5 * (1 << 30)) and c.debug and not c.background_compile
    assert c.start_mode == "eager" and c.platform == "cpu"


def test_the_defaults_hold_with_nothing_set(monkeypatch):
    for name in {n for n, _, _ in BAD}:
        monkeypatch.delenv(name, raising=False)
    c = Config()
    assert (c.max_executables, c.max_graphs, c.peek_cache_bytes, c.memory_limit) == \
        (0, 256, 256 << 20, None)
    assert c.check_device_indices and c.background_compile and not c.debug


@pytest.mark.parametrize("field,value", [("max_executables", -1), ("max_graphs", 0),
                                         ("max_graphs", "many"), ("peek_cache_bytes", -1),
                                         ("frequent_compiles", 0)])
def test_setting_a_bad_value_at_run_time_is_refused_and_changes_nothing(field, value):
    before = getattr(xlanb.config, field)
    with pytest.raises(SettingError, match=f"xlanb.config.{field}="):
        setattr(xlanb.config, field, value)
    assert getattr(xlanb.config, field) == before


def test_import_xlanb_names_the_bad_variable():
    proc = subprocess.run([sys.executable, "-c", "import xlanb"], capture_output=True, text=True,
                          env=_child_env({"XLANB_MAX_EXECUTABLES": "abc"}), timeout=180)
    assert proc.returncode != 0
    assert "XLANB_MAX_EXECUTABLES='abc' is not valid: it takes a whole number >= 0" in proc.stderr
    assert "invalid literal" not in proc.stderr


RUN_TIME_BAD = [("scan_layers", "sometimes"), ("scan_layers", 2), ("memory_limit", "lots"),
                ("memory_limit", -1), ("mat_mul_precision", "ultra"), ("debug", "maybe"),
                ("debug_nans", 2), ("background_compile", "off please"),
                ("quick_peeks", None), ("check_device_indices", "sometimes"),
                ("warn_fallbacks", []), ("store_readonly", "ro"), ("dist_check", 3),
                ("memory_limit_target", "yes please"), ("memory_line_bytes", "lots"),
                ("store_max_bytes", 0), ("start_mode", "fast"), ("inspect", "values"),
                ("platform", "quantum"), ("store_dir", 3), ("store_key_file", None),
                ("eager_runs", -1), ("tier_up", "often"), ("quick_compiles", "very")]


@pytest.mark.parametrize("field,value", RUN_TIME_BAD, ids=[f"{f}={v!r}" for f, v in RUN_TIME_BAD])
def test_every_run_time_field_is_checked_as_its_variable_is(field, value):
    """Issue 46, item 14: ``scan_layers = "0"`` turned looping on (a non-empty string),
    ``memory_limit = "1G"`` was a TypeError at the next sync and ``mat_mul_precision =
    "ultra"`` a KeyError at the next matmul; the other fields took anything."""
    before = getattr(xlanb.config, field)
    with pytest.raises(SettingError, match=rf"xlanb.config.{field}=.* is not valid: it takes"):
        setattr(xlanb.config, field, value)
    assert getattr(xlanb.config, field) == before


def test_run_time_fields_take_what_their_variables_take():
    c = Config()
    c.scan_layers = "0"
    assert c.scan_layers is False
    c.scan_layers = "AUTO"
    assert c.scan_layers == "auto"
    c.scan_layers = True
    assert c.scan_layers is True
    c.memory_limit = "1G"
    assert c.memory_limit == 1 << 30
    c.memory_limit = None
    assert c.memory_limit is None
    c.mat_mul_precision = "High"
    assert c.mat_mul_precision == "high"
    c.debug = "on"
    c.background_compile = 0
    assert c.debug is True and c.background_compile is False
    c.memory_line_bytes = "1M"
    assert c.memory_line_bytes == 1 << 20
    c.start_mode = "Eager"
    assert c.start_mode == "eager"


def test_a_process_id_past_the_process_count_names_both_variables(monkeypatch):
    """Issue 46 (low): XLANB_PROCESS_ID=2 with XLANB_NUM_PROCESSES=2 gave JAX's error at
    initialize(), which names neither variable."""
    monkeypatch.setenv("XLANB_NUM_PROCESSES", "2")
    monkeypatch.setenv("XLANB_PROCESS_ID", "2")
    with pytest.raises(SettingError, match=r"XLANB_PROCESS_ID='2' is not valid: it takes a "
                                           r"process number below XLANB_NUM_PROCESSES=2 \(0 to 1\)"):
        Config()
    monkeypatch.setenv("XLANB_PROCESS_ID", "1")
    Config()  # the last one is fine
    from xlanb import distributed
    with pytest.raises(ValueError, match=r"process_id=5 is not one of the 2 processes \(0 to 1;"):
        distributed.initialize("127.0.0.1:1", num_processes=2, process_id=5)
    assert not distributed.is_initialized()


def test_processes_a_test_starts_inherit_no_xlanb_setting(monkeypatch):
    """One policy for every child process (tests/support.py): a setting a test sets for
    itself never reaches the programs it starts, which import this checkout's xlanb
    with the store off."""
    from support import ROOT, child_env
    monkeypatch.setenv("XLANB_MODE", "opbyop")
    monkeypatch.setenv("XLANB_DEBUG", "1")
    monkeypatch.setenv("PYTHONBREAKPOINT", "xlanb.set_trace")
    code = ("import os, xlanb; print(xlanb.get_mode(), xlanb.config.debug, "
            "repr(xlanb.config.store_dir), os.environ.get('PYTHONBREAKPOINT'), xlanb.__file__)")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                         text=True, timeout=180, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    mode, debug, cache, hook, where = out.stdout.split()
    assert (mode, debug, cache, hook) == ("lazy", "False", "None", "None")  # store off
    assert where.startswith(os.path.join(ROOT, "xlanb"))
    assert child_env({"XLANB_MODE": "eager"})["XLANB_MODE"] == "eager"  # given, not inherited


def test_the_kernel_spec_knows_the_modes_xlanb_has():
    """kernel/spec.py keeps its own copy of the modes (it imports neither torch nor JAX):
    the copy and its message are xlanb's."""
    from kernel import spec
    assert spec.MODES == xlanb.MODES
    for bad in ("fast", "Lazy "):
        with pytest.raises(ValueError) as theirs:
            spec.kernel_json(bad)
        with pytest.raises(ValueError) as ours:
            xlanb.set_mode(bad)
        assert str(theirs.value) == str(ours.value)


def test_the_starting_mode_is_the_setting():
    """``xlanb.reset()`` returns to ``config.start_mode`` (read once from ``XLANB_MODE``)."""
    before = xlanb.config.start_mode
    other = "opbyop" if before != "opbyop" else "eager"
    try:
        xlanb.config.start_mode = other
        xlanb.reset()
        assert xlanb.get_mode() == other
    finally:
        xlanb.config.start_mode = before
        xlanb.reset()
    assert xlanb.get_mode() == before
