"""One module per ``kvsched`` subcommand; see `conformance.cli`."""
