"""``%%xla_profile --export`` to a folder that is not there (issue 37, item 11): a
UsageError naming the folder, before the cell runs, where a raw FileNotFoundError came
after it."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402


@pytest.fixture
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "xlanb")
    shell.run_cell("import torch, xlanb", store_history=True)
    yield shell
    shell.run_line_magic("unload_ext", "xlanb")
    shell.user_ns.pop("ran", None)


def test_export_to_a_missing_folder_is_a_usage_error_and_nothing_runs(ip, tmp_path):
    target = tmp_path / "no" / "such" / "trace.json"
    ip.user_ns["ran"] = 0
    with pytest.raises(UsageError, match=f"the folder {tmp_path / 'no' / 'such'} does not exist"):
        ip.run_cell_magic("xla_profile", f"--export {target}", "ran += 1\n")
    assert ip.user_ns["ran"] == 0


def test_export_to_an_existing_folder_writes_the_trace(ip, tmp_path):
    target = tmp_path / "trace.json"
    ip.user_ns["ran"] = 0
    p = ip.run_cell_magic("xla_profile", f"--export {target}",
                          "ran += 1\n(torch.ones(3, device='xla') * 2).sum().item()\n")
    assert ip.user_ns["ran"] == 1 and os.path.getsize(target) > 0 and p is not None
