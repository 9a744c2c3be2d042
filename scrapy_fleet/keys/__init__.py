"""Every Redis key name is built in this package, and only here.

* :mod:`~scrapy_fleet.keys.crawl`: a crawl's keys (:class:`CrawlKeys`) and the layout of
  them all, the schema (its module docstring: read it first);
* :mod:`~scrapy_fleet.keys.calls`: the KEYS each Lua script takes, declared once, in order;
* :mod:`~scrapy_fleet.keys.partition`: which partition holds a host, each partition's hash tag;
* :mod:`~scrapy_fleet.keys.fleet`: keys that are not one crawl's (a host's learned capacity,
  a proxy pool's, a scrapy-redis start key's and crawl's);
* :mod:`~scrapy_fleet.keys.naming`: what the key classes share.

A name is imported from the module that defines it (``from scrapy_fleet.keys.crawl import
CrawlKeys``): no re-exports (tests/unit/test_layers.py).
"""
