"""Templates built from Debian packages: the store the host agent serves them from
(``store``), building one with mmdebstrap (``build``), what a build shows while it runs
(``progress``), what the agent serves (``catalog``) and runs at a sandbox's start
(``startup``). See docs/templates.md."""
