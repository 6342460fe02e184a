"""Per-team (and per-key) budgets, one module per concept.

A request first *reserves* its worst-case cost (`estimate.py`; an atomic check-and-reserve in the
store), then *settles* the actual cost (idempotent by request id) or *releases* the reservation.
Reservations carry a lease; expired ones are reclaimed so a replica that dies mid-request cannot
leak budget.

- `money.py`: nano-USD conversions (every store counts integer nanos, so sums are exact)
- `periods.py`: hourly / daily / weekly / monthly / total windows and rpm/tpm minutes
- `scopes.py`: whose budget a request draws on (team, key) and its configured limits
- `ledger.py`: the append-only charge record and the audit that rebuilds spend from it
- `store.py`: the `BudgetStore` contract, its results and errors
- `memory.py`: the in-process store (the embedded default)
- `redis_store.py` + `*.lua`, `codec.py` (key layout, limit encoding), `journal.py`: the Redis store
- `redis_cluster_store.py`: the same store on a Redis Cluster (`budgets.store: redis-cluster`)
- `factory.py`: the one place that builds the configured store (and the key store beside it)
- `metrics.py`: Prometheus gauges of spend and remaining budget
"""
