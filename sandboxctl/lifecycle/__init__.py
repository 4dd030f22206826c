"""How every long-lived sandboxctl process runs its parts: a :class:`Runnable` runs until
its :class:`Stop` is set; :class:`Loop` is the one periodic loop; :class:`Manager` starts
the parts in groups, takes the stop signals, stops them in reverse and gives the exit
code; :class:`Background` runs one part on its own thread outside a manager."""

from sandboxctl.lifecycle.loop import Loop
from sandboxctl.lifecycle.manager import (
    EXIT_FAILED,
    EXIT_STOPPED,
    STOP_SIGNALS,
    Election,
    Group,
    Manager,
)
from sandboxctl.lifecycle.runnable import Background, Runnable
from sandboxctl.lifecycle.stop import Stop

__all__ = [
    "EXIT_FAILED",
    "EXIT_STOPPED",
    "STOP_SIGNALS",
    "Background",
    "Election",
    "Group",
    "Loop",
    "Manager",
    "Runnable",
    "Stop",
]
