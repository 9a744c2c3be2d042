"""scrapy_fleet: distributed, crash-proof Scrapy crawling with all job state in Redis.

Enable in a project's settings::

    ADDONS = {"scrapy_fleet.Addon": 500}
    FLEET_REDIS_URL = "redis://127.0.0.1:6379/0"
"""

from scrapy_fleet.addon import Addon

__all__ = ["Addon"]
__version__ = "0.1.0"
