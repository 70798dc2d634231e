"""The webhook outbox: events written in the transaction of the change they report (events.py), delivered at
least once, signed, in order per batch and receiver (webhooks.py)."""
