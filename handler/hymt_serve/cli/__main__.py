"""``python -m hymt_serve.cli``: the ``hymt`` command."""

import sys

from hymt_serve.cli.main import main

sys.exit(main())
