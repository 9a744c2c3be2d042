"""A scrapy-redis project's settings after docs/from-scrapy-redis.md's two-minute path: its
SCHEDULER and DUPEFILTER_CLASS lines may stay (the add-on replaces them), the add-on is
enabled, and REDIS_URL (given with -s by the tests) is the fleet's Redis too."""

SPIDER_MODULES = ["srproject.spiders"]
NEWSPIDER_MODULE = "srproject.spiders"

DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
SCHEDULER = "scrapy_redis.scheduler.Scheduler"
SCHEDULER_PERSIST = True

ITEM_PIPELINES = {"scrapy_redis.pipelines.RedisPipeline": 400}

ADDONS = {"scrapy_fleet.Addon": 500}
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
DOWNLOAD_DELAY = 0
CONCURRENT_REQUESTS_PER_DOMAIN = 16
