"""The conformance runner: adapters, trace generation, drivers, reports, replay and the CLI."""
