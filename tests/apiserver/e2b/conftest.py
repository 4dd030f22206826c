from tests.apiserver.e2b.stack import stack  # noqa: F401  (the real loopback stack, per session)
from tests.cli.conftest import run  # noqa: F401  (the in-process CLI fixture)
