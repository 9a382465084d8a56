"""Root conftest: makes the shared test support importable from agent/tests and tests/."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "agent" / "tests"))

pytest_plugins = ["support.fixtures"]

# Property tests are deterministic in every run (the same generated examples, so CI cannot turn
# red by luck), and have no per-example deadline (a shared 2-core machine is slow at times).
from hypothesis import settings  # noqa: E402

settings.register_profile("gpulse", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("gpulse")
