"""The fleet cockpit: heartbeats, fleet-wide counters, time series and their views."""
