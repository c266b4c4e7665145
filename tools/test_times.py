"""Where a test run's time went, from pytest's junit XML (``--junitxml``): the slowest
files and tests. ``.ci/run`` prints it last, since CI's log shows only its end.

    python tools/test_times.py times.xml [N]
"""
from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def times(path: str) -> list[tuple[str, str, float]]:
    """(file, test, seconds) for each test case: setup, call and teardown together."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is "tests.test_x" or "tests.test_x.TestClass"
        file = "/".join(p for p in module if not p[:1].isupper()) + ".py"
        out.append((file, case.get("name", ""), float(case.get("time", 0.0))))
    return out


def main(argv: list[str]) -> int:
    rows = times(argv[1])
    n = int(argv[2]) if len(argv) > 2 else 15
    by_file = collections.Counter()
    for file, _, t in rows:
        by_file[file] += t
    print(f"{len(rows)} tests, {sum(by_file.values()):.0f} s of test time in all")
    for file, t in by_file.most_common(n):
        print(f"{t:8.1f} s  {file}")
    for file, name, t in sorted(rows, key=lambda r: -r[2])[:n]:
        print(f"{t:8.1f} s  {file}::{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
