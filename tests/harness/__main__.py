"""`python -m tests.harness`: say whether this machine can run the tests across hosts (root, network namespaces,
redis-server, pgserver's PostgreSQL)."""

import sys

from tests.harness.processes import hosts_unavailable

reasons = hosts_unavailable()
print("\n".join(reasons) or "ok")
sys.exit(1 if reasons else 0)
