"""Root conftest: makes the shared test support importable from agent/tests and tests/, and draws the
fast lane (``pytest --fast``, ``make test-fast``: see ``agent/tests/support/lanes.py``)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "agent" / "tests"))

pytest_plugins = ["support.fixtures"]

# Property tests are deterministic in every run (the same generated examples, so CI cannot turn
# red by luck), and have no per-example deadline (a shared 2-core machine is slow at times).
from hypothesis import settings  # noqa: E402
from support.lanes import SLOW_PROGRAMS, lane  # noqa: E402

settings.register_profile("gpulse", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("gpulse")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast lane: leave out test files that use slow things (support/lanes.py) and tests marked slow",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the fast lane a slow test file is not even imported (some frameworks take seconds to import)."""
    if config.getoption("fast") and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True if lane(collection_path).file else None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses something slow is marked ``slow``; the fast lane deselects whatever is marked so."""
    for item in items:
        function = getattr(item, "originalname", None)
        reason = lane(item.path).reason(function) if function and item.path.suffix == ".py" else None
        if reason:
            item.add_marker(pytest.mark.slow(reason=reason))
    if config.getoption("fast"):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("fast"):
        sys.addaudithook(_refuse_slow_programs)


def _refuse_slow_programs(event: str, args: tuple) -> None:
    """In the fast lane, a test that starts a slow program fails and says where it belongs (a test file
    that starts one through a helper ``lanes.py`` cannot see)."""
    if event != "subprocess.Popen":
        return
    argv = [os.fspath(a) for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
    program = os.path.basename(argv[0]) if argv else ""
    if program in SLOW_PROGRAMS:
        raise RuntimeError(
            f"the fast lane (pytest --fast) started {program!r}: that test is slow; mark its file with "
            "pytestmark = pytest.mark.slow, or teach agent/tests/support/lanes.py what it uses"
        )
