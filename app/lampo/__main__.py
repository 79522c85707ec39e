"""`python -m lampo` is the `lampo` command."""

import sys

from lampo.cli import main

sys.exit(main())
