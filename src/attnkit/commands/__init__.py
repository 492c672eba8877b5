"""Subcommands of the ``attnkit`` console command, one module each."""
