"""A Scrapy project for the fleet's tests: special spiders the example project has no use for.

Its workers fail on a deprecated Scrapy API as the test process does (pyproject.toml's
filterwarnings): a ScrapyDeprecationWarning raised in a worker is an error in its log.
"""

import warnings

from scrapy.exceptions import ScrapyDeprecationWarning

warnings.filterwarnings("error", category=ScrapyDeprecationWarning)

BOT_NAME = "fleettest"
SPIDER_MODULES = ["fleettest.spiders", "fleettest.sink_spiders", "fleettest.partition_spiders",
                  "fleettest.recrawl_spiders", "fleettest.compat_spiders",
                  "fleettest.session_spiders"]
ADDONS = {"scrapy_fleet.Addon": 500}
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
