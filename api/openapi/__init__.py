"""The OpenAPI document: every operation's body, parameters and answers."""
