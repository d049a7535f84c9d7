"""``python -m hymt_serve.ops.frontend_guard``: build the plugin's jar."""

import sys

from hymt_serve.ops.frontend_guard import main

sys.exit(main())
