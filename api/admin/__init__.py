"""What on-call and operators use: the dead-letter queue, batching stats and live tuning."""
