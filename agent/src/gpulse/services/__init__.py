"""Long-running services of the stack that are neither the agent nor a dashboard (the alert receiver)."""
