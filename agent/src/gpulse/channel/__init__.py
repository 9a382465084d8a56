"""The training channel: the datagram contract between a training process and its node's agent.

Standard library only: the training library imports it (``endpoint``, the client's socket), and
the agent runs its other end (``server``, the agent's socket)."""
