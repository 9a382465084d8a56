"""Root conftest: makes the shared test support importable from agent/tests and tests/."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "agent" / "tests"))

pytest_plugins = ["support.fixtures"]
