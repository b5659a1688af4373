"""The front door: the lanes a request enters by, who may call, the bodies read and written (errors and rate limits among them), health."""
