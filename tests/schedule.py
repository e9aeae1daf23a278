"""The order the suite's two workers take test files in: the longest first, by the seconds each took last time.

``--dist loadfile`` gives a worker a whole test file (its module fixtures are built once), and xdist hands the
files out by how many tests each has, most first. Test count is a poor measure of cost here: the slowest file
(``test_gpu_check.py``, one test of 95 s) went last, and so did the other few-test, subprocess-heavy files,
leaving one worker idle while the other ran them. This plugin hands the costliest remaining file to whichever
worker asks next (longest-processing-time-first), from ``tests/durations.json``; a file not in it counts as the
median file's seconds (with no file at all, xdist's own measure: the number of tests). The documentation pages
of ``test_readme.py`` (each its own script, sharing no fixture) go to workers one by one rather than as one file.

``pytest -n 2 --dist loadfile --store-durations`` rewrites ``tests/durations.json`` from that run (the seconds
of setup, call and teardown of every test, summed per file). Only the order depends on it: a stale or missing
file changes how long the suite takes, never what it runs.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
ONE_BY_ONE = ("tests/test_readme.py",)  # files whose tests share no fixture: each test is a unit of its own


def scope_of(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0]
    return nodeid if file in ONE_BY_ONE else file


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test file's seconds to {DURATIONS.name}, for the next run's order")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    default = statistics.median(known.values()) if known else 0.0

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            costliest = max(self.workqueue, key=lambda scope: (known.get(scope, default), len(self.workqueue[scope])))
            self.workqueue.move_to_end(costliest, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


class _Recorder:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[scope_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.seconds:
            DURATIONS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(self.seconds.items())}, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # the controller sees every worker's reports; a worker writes nothing
    if config.getoption("store_durations", False) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(), "store-durations")
