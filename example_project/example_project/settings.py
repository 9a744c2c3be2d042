"""Settings of the example project: a plain Scrapy project turned into a fleet by one add-on.

Run a worker with, for example::

    scrapy crawl docs -s FLEET_REDIS_URL=redis://127.0.0.1:6379/0 \
        -s FLEET_IDLE_TIMEOUT=5 -s FLEET_JSONL_PATH=out-1.jsonl

``FLEET_JSONL_PATH`` (the durable item sink) is deliberately not set here: each worker gets
its own file on the command line.
"""

import os

BOT_NAME = "example_project"
SPIDER_MODULES = ["example_project.spiders"]
NEWSPIDER_MODULE = "example_project.spiders"

# The whole fleet activation: the add-on sets the scheduler, the dupefilter, the fleet's
# middlewares and extensions. The spiders stay plain scrapy.Spider subclasses.
ADDONS = {"scrapy_fleet.Addon": 500}
FLEET_REDIS_URL = os.environ.get("FLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
# With a recrawl (FLEET_RECRAWL = "adaptive"), a revisit's items reach the pipelines only when
# they changed; the docs spider stamps each item with its fetch time, which changes at every
# visit by construction: it is left out of the comparison.
FLEET_RECRAWL_IGNORE_FIELDS = ["fetched_at"]

# The demo and the tests crawl sites served on 127.0.0.1 by the project itself.
ROBOTSTXT_OBEY = False
USER_AGENT = "scrapy-fleet-example (+https://github.com/scrapy-fleet)"
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
DOWNLOAD_TIMEOUT = 30

LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False
FEED_EXPORT_ENCODING = "utf-8"
