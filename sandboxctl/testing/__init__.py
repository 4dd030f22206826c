"""Test doubles that ship in the package, so that test lanes can run them as processes
(``python -m sandboxctl.testing.kubeapi``). Nothing in production imports them: the
package sits on the top layer of the import contract, beside ``__main__``."""
