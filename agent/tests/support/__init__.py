"""Test support shared by the agent's tests and the stack tests in ../tests."""
