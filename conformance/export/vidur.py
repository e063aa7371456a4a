"""Export to vidur (to come)."""

EXPORTERS = ()
