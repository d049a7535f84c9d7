"""Locust spike: a steady trickle, a burst far beyond the server's queue, then the trickle again.

Run against a server with a small job queue, with ``HYMT_REJECT_MS`` set so that fast 503s count
as expected rejections; any other failure, or a slow 503, fails the run (exit code 1).

    HYMT_REJECT_MS=2000 locust -f loadtest/spike.py --headless --host http://127.0.0.1:8080

Environment: HYMT_SPIKE_USERS (40), HYMT_BASE_USERS (2), HYMT_STAGE_S (10: seconds per stage),
plus everything loadtest/locustfile.py reads.
"""

from __future__ import annotations

import os

from locust import LoadTestShape
from locustfile import TranslationUser

__all__ = ["Spike", "TranslationUser"]


class Spike(LoadTestShape):
    """Base load, spike, base load: one stage each, then stop."""

    base = int(os.environ.get("HYMT_BASE_USERS", "2"))
    spike = int(os.environ.get("HYMT_SPIKE_USERS", "40"))
    stage = float(os.environ.get("HYMT_STAGE_S", "10"))

    def tick(self) -> tuple[int, float] | None:
        elapsed = self.get_run_time()  # type: ignore[no-untyped-call]  # locust is untyped here
        if elapsed < self.stage:
            return self.base, self.base
        if elapsed < 2 * self.stage:
            return self.spike, self.spike  # all at once: a burst, not a ramp
        if elapsed < 3 * self.stage:
            return self.base, self.spike
        return None
