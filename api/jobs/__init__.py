"""Batch jobs (OpenAI's Batch API): their routes, their lines, and the driver every API worker runs."""
