"""``python -m replay``: serve the replay model as a process (see :mod:`replay.server`)."""

import sys

from replay.server import main

sys.exit(main())
