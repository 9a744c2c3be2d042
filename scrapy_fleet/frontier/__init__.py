"""The shared frontier: the Redis client of frontier.lua, the Scrapy scheduler over it, the
fleet-wide Bloom dupefilter, the spider middleware for start requests, memory checks.

| module | what |
| --- | --- |
| ``client`` | frontier clients: one round trip of ``lua/frontier.lua`` per call |
| ``scheduler`` | ``FleetScheduler``: Scrapy's scheduler interface over the frontier |
| ``dupefilter`` | ``RedisBloomDupeFilter``: the dupefilter interface over the same Bloom filter |
| ``bloom`` | scalable Bloom filter parameters (the filter runs in ``lua/bloom.lua``) |
| ``spidermw`` | ``FleetSpiderMiddleware``: start requests, their back pressure, link parents |
| ``memory`` | Redis ``maxmemory`` checks at start |
"""
