"""The probe budget: a token bucket per proxy replica."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` banked; starts full. Thread-safe."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Spend one token; False (and nothing spent) when the bucket is empty."""
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._at)
            self._at = now
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True
