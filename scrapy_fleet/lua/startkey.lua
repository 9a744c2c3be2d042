-- startkey.lua: a worker takes entries from a scrapy-redis spider's start key (the key its
-- producers LPUSH, SADD or ZADD into) without losing one: an entry moves, in this one step,
-- from the start key to the `taking` hash under a deadline, and leaves `taking` only once the
-- worker says the fleet's frontier holds its requests ("done").  A worker that stops renewing
-- its deadlines (killed) leaves its entries to the next worker whose call finds them overdue.
--
-- Keys (of K, keys.START_KEY_CALL): start (LIST, SET or ZSET: the producers' key), taking
--   (HASH id -> "<worker>\n<entry>", field "#": the id counter), deadlines (ZSET id -> ms),
--   bad (LIST: entries no request could be made from)
-- ARGV: 1 kind: "list" | "set" | "zset"   2 worker id   3 deadline ms (lease)
--   4 n: entries to take at most (0: none; -1: none, and the ids to renew are given back:
--   overdue at once, for another worker, as a worker that closes does)   5 count of ids done   6 count of ids bad
--   then the done ids, the bad ids, and the ids to renew (every id this worker still holds)
-- Order of taking, as scrapy-redis pops: a list from its head (the newest LPUSH first), a
--   set at random (SPOP), a sorted set highest score first.
-- Reply: {remaining, overdue, taken} where remaining = entries in the start key + entries
--   taken and not done (anyone's), after this call; taken = a flat list id1, entry1, id2, ...:
--   first the `overdue` entries of stopped workers (now this worker's), then new ones.
-- Work per call: O(n + ids), in a bounded number of commands (one per kind of write) plus
--   two per overdue entry.  Times are the Redis server's clock.

local kind, me, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local n, n_done, n_bad = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if (kind ~= 'list' and kind ~= 'set' and kind ~= 'zset') or me == nil or me == ''
    or not lease_ms or lease_ms <= 0 or not n or not n_done or not n_bad then
  return redis.error_reply('ERR fleet: bad startkey call')
end
local clock = redis.call('TIME')  -- (no common.lua: a smaller chunk runs faster per call)
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local prefix = me .. '\n'

-- the ids of ARGV[from..to] this worker holds, and their entries
local function owned(from, to)
  local ids, entries = {}, {}
  if to < from then return ids, entries end
  local values = redis.call('HMGET', K.taking, unpack(ARGV, from, to))
  for i, value in ipairs(values) do
    if value and string.sub(value, 1, #prefix) == prefix then
      ids[#ids + 1] = ARGV[from + i - 1]
      entries[#entries + 1] = string.sub(value, #prefix + 1)
    end
  end
  return ids, entries
end

local function forget(ids)
  if #ids > 0 then
    redis.call('HDEL', K.taking, unpack(ids))
    redis.call('ZREM', K.deadlines, unpack(ids))
  end
end

local first_renew = 7 + n_done + n_bad
forget((owned(7, 6 + n_done)))
local bad_ids, bad_entries = owned(7 + n_done, first_renew - 1)
if #bad_ids > 0 then
  redis.call('RPUSH', K.bad, unpack(bad_entries))
  forget(bad_ids)
end
local renewed_until = now + lease_ms
if n < 0 then renewed_until = 0 end
local renew_ids = owned(first_renew, #ARGV)
if #renew_ids > 0 then
  local pairs_ = {}
  for _, id in ipairs(renew_ids) do
    pairs_[#pairs_ + 1] = renewed_until
    pairs_[#pairs_ + 1] = id
  end
  redis.call('ZADD', K.deadlines, 'XX', unpack(pairs_))
end

local taken, overdue_count = {}, 0
if n > 0 then
  -- overdue entries of a worker that stopped renewing: this worker's now
  local overdue = redis.call('ZRANGEBYSCORE', K.deadlines, '-inf', now, 'LIMIT', 0, n)
  for _, id in ipairs(overdue) do
    local value = redis.call('HGET', K.taking, id)
    if value then
      local cut = string.find(value, '\n', 1, true)
      local entry = cut and string.sub(value, cut + 1) or value
      redis.call('HSET', K.taking, id, prefix .. entry)
      redis.call('ZADD', K.deadlines, now + lease_ms, id)
      taken[#taken + 1] = id
      taken[#taken + 1] = entry
    else
      redis.call('ZREM', K.deadlines, id)
    end
  end
  overdue_count = #taken / 2
  local want = n - overdue_count
  local entries = {}
  if want > 0 then
    if kind == 'list' then
      entries = redis.call('LRANGE', K.start, 0, want - 1)
      if #entries > 0 then redis.call('LTRIM', K.start, #entries, -1) end
    elseif kind == 'set' then
      entries = redis.call('SPOP', K.start, want)
    else
      entries = redis.call('ZREVRANGE', K.start, 0, want - 1)
      if #entries > 0 then redis.call('ZREMRANGEBYRANK', K.start, -#entries, -1) end
    end
  end
  if #entries > 0 then
    local last = redis.call('HINCRBY', K.taking, '#', #entries)
    local fields, scores = {}, {}
    for i, entry in ipairs(entries) do
      local id = tostring(last - #entries + i)
      fields[#fields + 1] = id
      fields[#fields + 1] = prefix .. entry
      scores[#scores + 1] = now + lease_ms
      scores[#scores + 1] = id
      taken[#taken + 1] = id
      taken[#taken + 1] = entry
    end
    redis.call('HSET', K.taking, unpack(fields))
    redis.call('ZADD', K.deadlines, unpack(scores))
  end
end

local size
if kind == 'list' then size = redis.call('LLEN', K.start)
elseif kind == 'set' then size = redis.call('SCARD', K.start)
else size = redis.call('ZCARD', K.start) end
return {size + redis.call('ZCARD', K.deadlines), overdue_count, taken}
