"""Fleet-wide politeness: per-host GCRA rates, concurrency caps, holds and back-off, and the
shared robots.txt, all kept in Redis and checked against Redis's clock.

| module | what |
| --- | --- |
| ``hosts`` | host keys and the client of ``lua/politeness.lua`` (holds, back-off, robots.txt) |
| ``middlewares`` | ``FleetPolitenessMiddleware`` and ``FleetRobotsTxtMiddleware`` (downloader) |
"""
