"""Requests that failed for good: their records in Redis, listing and retry (docs/failures.md)."""
