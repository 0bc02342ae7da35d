"""python -m scaling {answer, plan, check}: see scaling.cli."""

import sys

from scaling.cli import main

sys.exit(main())
