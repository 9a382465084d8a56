"""The one compiled part of gpulse: the training thread's step recorder, step record, phase timer
and timed loader (src/gpulse/training/_hotpath.c). Everything else is in pyproject.toml.

Optional: where it cannot be built (no C compiler, or a platform without clock_gettime), the build
warns (shown by ``pip install -v``) and gpulse installs without it; gpulse.training.step then uses
its Python references (same behaviour, about 1.3 µs more a step on the training thread hot, 8 µs in the loop, on a
2-vCPU VM: BENCHMARKS.md).
The agent's image (agent/Dockerfile) does not copy this file: the agent never runs the hot path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gpulse.training._hotpath", ["src/gpulse/training/_hotpath.c"], optional=True)])
