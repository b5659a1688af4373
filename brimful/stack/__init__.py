"""The embedded local stack (broker, Redis, Triton, API, batcher) and its process handling."""

from brimful.stack.embedded import EmbeddedStack, settings_env, settings_on_free_ports, tansu_binary
from brimful.stack.processes import ManagedProcess, StackError, free_port, wait_until
from brimful.stack.supervisor import RestartBackoff, Supervisor

__all__ = [
    "EmbeddedStack",
    "ManagedProcess",
    "RestartBackoff",
    "StackError",
    "Supervisor",
    "free_port",
    "settings_env",
    "settings_on_free_ports",
    "tansu_binary",
    "wait_until",
]
