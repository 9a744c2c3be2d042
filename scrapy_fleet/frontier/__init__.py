"""The shared frontier: the Redis client of frontier.lua, the Scrapy scheduler over it, the
fleet-wide Bloom dupefilter, the spider middleware for start requests, memory checks.

| module | what |
| --- | --- |
| ``client`` | ``AsyncFrontier``: the workers' client, one ``lua/frontier.lua`` round trip a call |
| ``admin`` | ``FrontierAdmin``: the blocking client of the commands (push, status, purge) |
| ``protocol`` | a call's arguments (``CallBatch``, ``FrontierParams``) and reply (``CallResult``) |
| ``dupecache`` | ``DupeCache``: Bloom keys a worker knows to be duplicates |
| ``scheduler`` | ``FleetScheduler``: Scrapy's scheduler interface over the frontier |
| ``dupefilter`` | ``RedisBloomDupeFilter``: the dupefilter interface over the same Bloom filter |
| ``bloom`` | scalable Bloom filter parameters (the filter runs in ``lua/bloom.lua``) |
| ``spidermw`` | ``FleetSpiderMiddleware``: start requests, their back pressure, link parents |
| ``memory`` | Redis ``maxmemory`` checks at start |
"""
