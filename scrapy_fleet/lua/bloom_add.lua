-- bloom_add.lua: check-and-add fingerprints to the crawl's scalable Bloom filter.
-- Used by RedisBloomDupeFilter.request_seen() when the filter runs outside FleetScheduler
-- (the scheduler checks fingerprints inside frontier.lua, in the same round trip as its pushes).
--
-- KEYS: 1 op (this call)  2 op (previous call)  3 bloom meta  4.. bloom slices
-- ARGV: 1 capacity  2 error rate  3 op ttl (ms)  4.. fingerprints (12 bytes each)
-- Reply: msgpack array of 1 (new) / 0 (seen), one per fingerprint.

local cached = redis.call('GET', KEYS[1])
if cached then
  return cached
end
for i = 4, #ARGV do
  if #ARGV[i] ~= 12 then
    return redis.error_reply('ERR fleet: fingerprints must be 12 bytes')
  end
end
local slice_keys = {}
for i = 4, #KEYS do slice_keys[#slice_keys + 1] = KEYS[i] end
local bloom = bloom_open(KEYS[3], slice_keys, tonumber(ARGV[1]), tonumber(ARGV[2]))
local fps = {}
for i = 4, #ARGV do fps[#fps + 1] = ARGV[i] end
local present = bloom_lookup(bloom, fps)
local flags, added = {}, {}
for i, fp in ipairs(fps) do
  if present[i] or added[fp] then
    flags[i] = 0  -- seen (also: the same fingerprint earlier in this call)
  else
    bloom_mark(bloom, fp)
    added[fp] = true
    flags[i] = 1
  end
end
bloom_flush(bloom)
local reply = cmsgpack.pack(flags)
redis.call('SET', KEYS[1], reply, 'PX', tonumber(ARGV[3]))
if KEYS[2] ~= KEYS[1] then
  redis.call('DEL', KEYS[2])
end
return reply
