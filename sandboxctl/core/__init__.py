"""Pure logic shared by every sandboxctl component: no I/O, no clock, no logging.

Modules: ``errors`` (the exception tree), ``durations`` and ``timestamps`` (parsing),
``model`` (NodeInventory), ``freshness`` (the staleness rule), ``snapshot`` (the
immutable fleet view and its indexes), ``simulation`` (the rule played over a timeline).
"""
