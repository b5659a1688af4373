"""Webhook endpoints and the sender that delivers their events."""
