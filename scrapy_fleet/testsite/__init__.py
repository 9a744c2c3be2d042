"""A deterministic test website and a small, observable HTTP server for it.

* :func:`generate_site` writes a static HTML site of any size (see :mod:`.generate`).
* :class:`SiteServer` serves a directory on one or more loopback addresses, logs every
  request as a JSON line and can be told to be slow, to rate-limit (429 / 503) or to
  answer a given robots.txt (see :mod:`.server`).

Command line::

    python -m scrapy_fleet.testsite generate DIR --pages 200 --links 8
    python -m scrapy_fleet.testsite serve DIR --bind 127.0.0.1 --port 8000 --log requests.jsonl
"""

from scrapy_fleet.testsite.generate import generate_site

__all__ = ["generate_site"]
