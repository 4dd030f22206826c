"""The fault lanes: a hand-run fault harness (kill a host, stop a publisher, stop the
control plane, and judge what readers see) as a product. A lane is one pass criterion; a
scenario is the sequence of actions a group of lanes judges (one kill of host B serves
K1A-03 to K1A-08). A kit is the fleet the lanes act on: built locally (``local``) or
named by an operator's file (``external``).
See docs/lanes.md."""
