"""The embedded local stack (broker, Redis, Triton, API, batcher) and its process handling."""

from brimful.stack.embedded import EmbeddedStack, settings_env, settings_on_free_ports, tansu_binary
from brimful.stack.processes import ManagedProcess, StackError, free_port, wait_until

__all__ = [
    "EmbeddedStack",
    "ManagedProcess",
    "StackError",
    "free_port",
    "settings_env",
    "settings_on_free_ports",
    "tansu_binary",
    "wait_until",
]
