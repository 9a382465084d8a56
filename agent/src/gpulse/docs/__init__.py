"""The generated documents' generators: each module renders one file under ``docs/`` (or a part of one)
from the code it documents, so that the runtime modules hold no documentation text.

``make generate`` runs them (``gpulse schema`` prints the schema's); tests in ``agent/tests/docs/``
fail when a file differs from its generator's output."""
