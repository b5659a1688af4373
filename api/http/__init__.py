"""The front door: the lanes a request enters by, reading bodies, answers and errors, who is calling, rate limits, health."""
