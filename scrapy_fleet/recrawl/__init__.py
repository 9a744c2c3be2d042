"""Recrawl: tracked pages come back into the frontier when due (docs/recrawl.md).

``settings.py`` reads ``FLEET_RECRAWL*`` into a ``RecrawlConfig``;
``signature.py`` is the content signature (simhash64 of the text); ``schedule.py`` the
per-URL state, the change-rate estimator and the next interval; ``middleware.py`` the
downloader middleware (conditional GET, outcome of a fetch) and the spider middleware (items
carry their fetch time and signature); ``guard.py`` refuses a worker without a recrawl on a
crawl that has a revisit schedule.  The schedule itself lives in Redis (keys/crawl.py
``revisit_*``), written by ``lua/step_revisit.lua`` with the acknowledgement.
"""
