"""The compiled parts of gpulse: the training thread's step recorder, step record, phase timer and
timed loader (src/gpulse/training/_hotpath.c), and the worker's step rows (src/gpulse/training/_rows.c).
Everything else is in pyproject.toml.

Optional: where they cannot be built (no C compiler, or a platform without clock_gettime), the build
warns (shown by ``pip install -v``) and gpulse installs without them; gpulse.training.step and
gpulse.training.plans then use their Python references (same behaviour, about 1.3 µs more a step on
the training thread hot, 8 µs in the loop, and about 1.5 µs more on the background thread hot, on a
2-vCPU VM: BENCHMARKS.md).
The agent's image (agent/Dockerfile) does not copy this file: the agent never runs them.
"""

from setuptools import Extension, setup

HEADER = ["src/gpulse/training/_record.h"]  # StepRecord's struct, which both modules read

setup(
    ext_modules=[
        Extension("gpulse.training._hotpath", ["src/gpulse/training/_hotpath.c"], depends=HEADER, optional=True),
        Extension("gpulse.training._rows", ["src/gpulse/training/_rows.c"], depends=HEADER, optional=True),
    ]
)
