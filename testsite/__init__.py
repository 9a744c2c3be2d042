"""A deterministic test website and a small, observable HTTP server for it.

* :func:`generate_site` writes a static HTML site of any size (see :mod:`.generate`).
* :class:`SiteServer` serves a directory on one or more loopback addresses, logs every
  request as a JSON line and can be told to be slow, to rate-limit (429 / 503) or to
  answer a given robots.txt (see :mod:`.server`).

Not part of the installed package: a folder of the repository (next to ``tests/``) that the
tests, the benchmarks and ``make demo`` import from a checkout (pytest puts the repository's
root on ``sys.path``; a subprocess runs ``python -m testsite`` with the root as its working
directory).  New kinds of site (a generator module, a server behaviour) go in as modules
here, exported below.

Command line (from the repository's root)::

    python -m testsite generate DIR --pages 200 --links 8
    python -m testsite serve DIR --bind 127.0.0.1 --port 8000 --log requests.jsonl
"""

from testsite.generate import generate_site

__all__ = ["generate_site"]
