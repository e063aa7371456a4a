import sys

from conformance.commands.cli import main

sys.exit(main())
