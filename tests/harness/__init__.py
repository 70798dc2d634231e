"""The test harness: real servers, started one way, and one `Topology` for a studio across hosts and servers.

- `processes`: waits on a condition, what this machine can run (`hosts_unavailable` and the like) and `Server`,
  how every server process starts (on host A or on a host of a network), is waited for, stops and crashes.
- `network`: hosts in network namespaces on one machine (`Network`, `Host`), cut off and let back.
- `redis_servers`, `postgres_servers`, `s3_server`: Redis (TCP or TLS, a master with its replica and three
  Sentinels), PostgreSQL (a primary, a streaming standby), S3 (SeaweedFS).
- `topology`: `Topology(tmp, Layout(...))` places those servers and the studio's workers on hosts, with the
  faults to break it with; `failover`: what a failover of its database or broker cost.

`python -m tests.harness` says whether this machine can run the tests across hosts.
"""
