"""The ``brimful`` command's subcommands; each module registers its parser and handler."""
