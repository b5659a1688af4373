"""The benchmarks' library: load generation, the floor server, saved reports, process usage."""
