"""Coming from scrapy-redis (docs/from-scrapy-redis.md): its spiders' start keys fed into the
fleet's frontier without loss (:mod:`.feeder`), its settings translated or refused
(:mod:`.settings`), ``RedisSpider``/``RedisCrawlSpider`` for projects that drop the
scrapy-redis dependency (:mod:`.spiders`), and the import of a scrapy-redis crawl
(:mod:`.importer`)."""
