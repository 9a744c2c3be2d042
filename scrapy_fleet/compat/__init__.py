"""Compatibility with what a Scrapy project brings along.

Scrapy's settings that would act per worker in silence get one start-up warning each
(:mod:`.per_worker`, docs/scrapy-compat.md).  Coming from scrapy-redis
(docs/from-scrapy-redis.md): its spiders' start keys fed into the fleet's frontier without
loss (:mod:`.feeder`), its settings translated or refused (:mod:`.settings`),
``RedisSpider``/``RedisCrawlSpider`` for projects that drop the scrapy-redis dependency
(:mod:`.spiders`), and the import of a scrapy-redis crawl (:mod:`.importer`)."""
