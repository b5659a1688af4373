"""The embedded local stack (broker, Redis, Triton, API, batcher), its process handling,
and reading its components' /metrics pages."""

from brimful.stack.embedded import EmbeddedStack, tansu_binary
from brimful.stack.metrics_page import read_sample_sums, sample_sums
from brimful.stack.processes import ManagedProcess, StackError, free_port, wait_until
from brimful.stack.stack_settings import settings_env, settings_on_free_ports
from brimful.stack.supervisor import RestartBackoff, Supervisor

__all__ = [
    "EmbeddedStack",
    "ManagedProcess",
    "RestartBackoff",
    "StackError",
    "Supervisor",
    "free_port",
    "read_sample_sums",
    "sample_sums",
    "settings_env",
    "settings_on_free_ports",
    "tansu_binary",
    "wait_until",
]
