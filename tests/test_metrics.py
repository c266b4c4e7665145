import importlib.util
import math
import pathlib
import re
import threading
import time

import pytest

try:
    from xlanb import metrics
except Exception:  # xlanb/__init__ mid-rewrite: metrics.py stands alone anyway
    _p = pathlib.Path(__file__).resolve().parents[1] / "xlanb" / "metrics.py"
    _spec = importlib.util.spec_from_file_location("_xlanb_metrics_standalone", _p)
    metrics = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(metrics)


@pytest.fixture(autouse=True)
def _clean():
    metrics.clear()
    yield
    metrics.clear()


_TIME_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?([\d.]+)us")


def parse_time(text):
    m = _TIME_RE.fullmatch(text)
    assert m, text
    d, h, mi, s, ms, us = m.groups()
    return (
        int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi or 0) * 60 + int(s or 0)
        + int(ms or 0) * 1e-3 + float(us) * 1e-6
    )


def test_counters():
    assert metrics.counter_value("UncachedCompile") is None
    metrics.counter("UncachedCompile")
    metrics.counter("UncachedCompile")
    metrics.counter("aten::nonzero", 5)
    metrics.counter("CachedCompile", 0)
    assert metrics.counter_value("UncachedCompile") == 2
    assert metrics.counter_value("aten::nonzero") == 5
    assert metrics.counter_value("CachedCompile") == 0
    assert metrics.counter_names() == ["CachedCompile", "UncachedCompile", "aten::nonzero"]


def test_metric_data_stats_and_tuple_compat():
    assert metrics.metric_data("CompileTime") is None
    for v in (4.0, 1.0, 3.0, 2.0):
        metrics.record("CompileTime", v)
    d = metrics.metric_data("CompileTime")
    assert (d.count, d.total, d.samples) == (4, 10.0, (4.0, 1.0, 3.0, 2.0))
    assert (d.min, d.max, d.mean) == (1.0, 4.0, 2.5)
    assert d.stddev == pytest.approx(math.sqrt(1.25))
    assert [d.percentile(p) for p in (0, 25, 50, 75, 100)] == [1.0, 1.0, 2.0, 3.0, 4.0]
    assert d.percentiles((50, 99)) == {50: 2.0, 99: 4.0}
    # torch_xla: met.metric_data(name) -> (total_samples, accumulator, samples)
    assert d[0] == 4 and d[1] == 10.0 and d[2] == d.samples and d[-1] == d.samples
    assert d[:1] == (4,) and len(d) == 3
    n, total, samples = d
    assert (n, total, samples) == (4, 10.0, d.samples)
    assert metrics.metric_names() == ["CompileTime"]
    with pytest.raises(ValueError):
        d.percentile(101)


def test_sample_ring_is_bounded():
    cap = metrics.SAMPLE_CAPACITY
    for i in range(cap + 10):
        metrics.record("ExecuteTime", float(i))
    d = metrics.metric_data("ExecuteTime")
    assert d.count == cap + 10 and d.total == sum(range(cap + 10))
    assert len(d.samples) == cap and d.samples[0] == 10.0 and d.samples[-1] == cap + 9
    assert d.min == 0.0  # min/max cover every sample, not just the kept ones


@pytest.mark.parametrize(
    "seconds, text",
    [
        (538.782309432, "08m58s782ms309.432us"),
        (1.23456789, "01s234ms567.890us"),
        (0.0123, "012ms300.000us"),
        (1.5e-6, "001.500us"),
        (0.0, "000.000us"),
        (3600.0, "01h00m00s000ms000.000us"),
        (90061.0, "01d01h01m01s000ms000.000us"),
        (0.9999999999, "01s000ms000.000us"),  # rounds to the ns without "1000.000us"
    ],
)
def test_format_time(seconds, text):
    assert metrics.format_time(seconds) == text
    assert parse_time(text) == pytest.approx(round(seconds, 9))


def test_report(monkeypatch):
    assert metrics.report() == ""
    clock = iter([5.0, 10.0, 12.0, 13.0])
    monkeypatch.setattr(metrics, "perf_counter", lambda: next(clock))
    metrics.clear()  # rate clock starts at 5.0
    metrics.record("CompileTime", 1.0)
    metrics.record("CompileTime", 3.0)
    metrics.record("ExecuteTime", 0.25)  # lone sample: rate measured since clear
    metrics.counter("UncachedCompile", 2)
    metrics.counter("CachedCompile")
    text = metrics.report()
    lines = text.splitlines()
    heads = [ln for ln in lines if not ln.startswith("  ")]
    assert heads == ["Metric: CompileTime", "Metric: ExecuteTime",
                     "Counter: CachedCompile", "Counter: UncachedCompile"]

    block = text.split("Metric: CompileTime\n")[1].split("Metric:")[0]
    fields = dict(ln.strip().split(": ", 1) for ln in block.splitlines())
    assert int(fields["TotalSamples"]) == 2
    assert parse_time(fields["Accumulator"]) == pytest.approx(4.0)
    assert parse_time(fields["Mean"]) == pytest.approx(2.0)
    assert parse_time(fields["StdDev"]) == pytest.approx(1.0)
    assert fields["Rate"] == "1 / second"  # 2 samples over 12s - 10s
    pct = dict(p.split("=") for p in fields["Percentiles"].split("; "))
    assert list(pct) == ["25%", "50%", "80%", "90%", "95%", "99%"]
    assert parse_time(pct["25%"]) == 1.0 and parse_time(pct["99%"]) == 3.0
    assert re.search(r"Metric: ExecuteTime\n(  .*\n)*  Rate: 0.125 / second\n", text)  # 1 / (13s - 5s)
    assert "Counter: UncachedCompile\n  Value: 2\n" in text
    assert "Counter: CachedCompile\n  Value: 1\n" in text


def test_short_report():
    assert metrics.short_report() == ""
    metrics.record("CompileTime", 1.5)
    metrics.record("OpCompileTime", 0.002)
    metrics.counter("OpCacheHit", 7)
    lines = metrics.short_report().splitlines()
    assert lines == [
        "CompileTime: n=1 total=1.5s mean=1.5s p50=1.5s max=1.5s",
        "OpCompileTime: n=1 total=2ms mean=2ms p50=2ms max=2ms",
        "OpCacheHit: 7",
    ]
    assert metrics.short_report("OpCacheHit") == "OpCacheHit: 7\n"
    assert metrics.short_report(["CompileTime", "Nope"]).startswith("CompileTime: n=1")


def test_clear_selectively():
    metrics.counter("OpCompile")
    metrics.record("OpCompileTime", 0.1)
    metrics.clear(counters=False)
    assert metrics.metric_data("OpCompileTime") is None
    assert metrics.counter_value("OpCompile") == 1
    metrics.record("OpCompileTime", 0.1)
    metrics.clear(metrics=False)
    assert metrics.counter_value("OpCompile") is None and metrics.counter_names() == []
    assert metrics.metric_data("OpCompileTime").count == 1
    metrics.clear()
    assert metrics.metric_names() == [] and metrics.report() == ""
    metrics.counter("OpCompile")  # counter() still writes to the live dict
    assert metrics.counter_value("OpCompile") == 1


def test_snapshot_and_diff():
    metrics.counter("CachedCompile")
    metrics.record("ExecuteTime", 0.5)
    before = metrics.snapshot()
    assert before == {"counters": {"CachedCompile": 1},
                      "metrics": {"ExecuteTime": {"count": 1, "total": 0.5}}}
    metrics.counter("CachedCompile", 2)
    metrics.counter("aten::nonzero")
    metrics.record("ExecuteTime", 0.25)
    metrics.record("TransferFromDeviceTime", 0.125)
    after = metrics.snapshot()
    expected = {
        "counters": {"CachedCompile": 2, "aten::nonzero": 1},
        "metrics": {"ExecuteTime": {"count": 1, "total": 0.25},
                    "TransferFromDeviceTime": {"count": 1, "total": 0.125}},
    }
    assert metrics.diff(before, after) == expected
    assert metrics.diff(before) == expected
    assert metrics.diff(after) == {"counters": {}, "metrics": {}}
    before["counters"]["CachedCompile"] = 100  # snapshots are copies
    assert metrics.counter_value("CachedCompile") == 3


def test_timer():
    with metrics.timer("TransferToDeviceTime") as t:
        time.sleep(0.01)
    d = metrics.metric_data("TransferToDeviceTime")
    assert d.count == 1 and d.total == t.elapsed and 0.01 <= t.elapsed < 1.0

    with pytest.raises(RuntimeError):
        with metrics.timer("TransferToDeviceTime"):
            raise RuntimeError("boom")
    assert metrics.metric_data("TransferToDeviceTime").count == 2

    @metrics.timer("CompileTime")
    def f(x):
        return x + 1

    assert f(1) == 2 and f(2) == 3 and f.__name__ == "f"
    assert metrics.metric_data("CompileTime").count == 2


def test_threads():
    def work():
        for _ in range(500):
            metrics.record("CompileTime", 0.001)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    d = metrics.metric_data("CompileTime")
    assert d.count == 2000 and d.total == pytest.approx(2.0)
