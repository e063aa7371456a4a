"""The pytest plugin (`pytest_plugin`): one conformance test per invariant, in a user's own CI."""
