"""Pure logic shared by every sandboxctl component: no I/O, no clock, no logging.

Modules, among others: ``errors`` (the exception tree), ``wire`` (every JSON body's typed
shape, one decoder and encoder), ``names`` (every API name, once), ``durations`` and
``timestamps`` (parsing), ``model`` (NodeInventory), ``freshness`` (the staleness rule),
``snapshot`` (the immutable fleet view and its indexes), ``placement`` (where a claim
goes, outcomes as types), ``simulation`` (the rule played over a timeline).
"""
