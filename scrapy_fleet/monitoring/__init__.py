"""The fleet's cockpit data: worker heartbeats, exact fleet-wide counters, bounded time series
(written by lua/monitoring.lua inside the frontier calls) and their one reader,
:func:`snapshot.read_snapshot` (docs/monitoring.md)."""
