"""One module per ``kvsched`` subcommand; see `conformance.commands.cli`."""
