"""python -m ffn_model {train, compile, bench}: see ffn_model.cli."""

import sys

from ffn_model.cli import main

sys.exit(main())
