-- bloom_add.lua: check-and-add fingerprints to the crawl's scalable Bloom filter.
-- Used by RedisBloomDupeFilter.request_seen() when the filter runs outside FleetScheduler
-- (the scheduler checks fingerprints inside frontier.lua, in the same round trip as its pushes).
--
-- Keys (of K, keys.BLOOM_ADD_CALL): op (this call's reply cache), prev_op (the previous
--   call's), bloom_meta, bloom_slices
-- ARGV: 1 capacity  2 error rate  3 op ttl (ms)  4.. fingerprints (12 bytes each)
-- Reply: msgpack array of 1 (new) / 0 (seen), one per fingerprint.

local cached = redis.call('GET', K.op)
if cached then
  return cached
end
for i = 4, #ARGV do
  if #ARGV[i] ~= 12 then
    return redis.error_reply('ERR fleet: fingerprints must be 12 bytes')
  end
end
local bloom = bloom_open(K.bloom_meta, K.bloom_slices, tonumber(ARGV[1]), tonumber(ARGV[2]))
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
redis.call('SET', K.op, reply, 'PX', tonumber(ARGV[3]))
if K.prev_op ~= K.op then
  redis.call('DEL', K.prev_op)
end
return reply
