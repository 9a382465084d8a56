"""The training channel: the datagram contract between a training process and its node's agent.

Standard library only: the training library imports it, and so does the agent's receiver."""
