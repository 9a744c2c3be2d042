-- failed.lua: failed requests and the crawl marker, for the frontier call (lua/step_ack.lua,
-- lua/step_check.lua) and failed_retry.lua; it defines locals only.  docs/failures.md
-- describes the model.
--
-- Keys (fields of the caller's key table, keys/crawl.py):
--   failed     HASH  entry id -> msgpack {url, method, reason, message, status, attempts,
--                    worker, host, at (server ms, set here), data (encoded request, set here)}
--   failed_at  ZSET  entry id -> at: oldest first, trimmed past the cap (fm)
--   failed_by  HASH  reason -> records kept with that reason
--   marker     STRING  the crawl marker: a random id written by the crawl's first frontier call
--
-- A failed request is acknowledged like any other (its entry leaves the frontier) and, in the
-- same atomic call, recorded here: the record is exact (never lost, never counted twice; a
-- replayed call returns the cached reply before reaching this code).
-- Work per call: a GET of the marker; per failure recorded 3 writes and 4 more per record
-- trimmed past the cap.

local function failed_bad_record(raw)
  if type(raw) ~= 'string' then return true end
  local ok, rec = pcall(cmsgpack.unpack, raw)
  return not ok or type(rec) ~= 'table' or type(rec.reason) ~= 'string' or rec.reason == ''
end

-- nil, or why the failure records of the acknowledgements `acks` ({id, token[, record[,
-- unstorable]]}: record "" for none; unstorable, a list of records of the requests its
-- callback yielded that the worker could not encode) or the records `unstorable` (requests
-- without a parent the worker could not encode) are not acceptable (checked before the
-- script's first write)
local function failed_check_acks(acks, unstorable)
  for _, a in ipairs(acks) do
    if type(a) ~= 'table' then return 'bad acknowledgement' end
    if a[3] ~= nil and a[3] ~= '' and failed_bad_record(a[3]) then
      return 'bad failure record'
    end
    if a[4] ~= nil then
      if type(a[4]) ~= 'table' then return 'bad failure record' end
      for _, raw in ipairs(a[4]) do
        if failed_bad_record(raw) then return 'bad failure record' end
      end
    end
  end
  if unstorable ~= nil then
    if type(unstorable) ~= 'table' then return 'bad failure record' end
    for _, raw in ipairs(unstorable) do
      if failed_bad_record(raw) then return 'bad failure record' end
    end
  end
  return nil
end

-- The crawl marker.  `expected` (ARGV field mk): "" on a client's first call, then the value
-- the crawl's first call wrote.  Returns (error message or nil, current value or false); no
-- write.  A client that has seen a marker and finds it gone (or another one) talks to a Redis
-- that lost the crawl's state (restarted without its data, flushed, purged).  `current`: the
-- marker's value when the caller read it already (false: none), else it is read here.
local function failed_check_marker(marker_key, expected, current)
  if current == nil then current = redis.call('GET', marker_key) end
  if type(expected) == 'string' and expected ~= '' and current ~= expected then
    return 'ERR fleet: crawl state lost: the crawl marker ' .. marker_key ..
      (current and ' changed' or ' is gone') ..
      ' (Redis restarted without its data, or the crawl was purged)', current
  end
  return nil, current
end

-- Write the marker when it is missing (after the checks): the crawl's first push or first
-- worker call.  Returns the marker's value.
local function failed_ensure_marker(marker_key, current, candidate)
  if current then return current end
  if type(candidate) ~= 'string' or candidate == '' then return false end
  redis.call('SET', marker_key, candidate)
  return candidate
end

local function failed_reason_of(raw)
  local ok, rec = pcall(cmsgpack.unpack, raw or '')
  if ok and type(rec) == 'table' and type(rec.reason) == 'string' then return rec.reason end
  return nil
end

-- Forget the record of `id` (retried or trimmed); returns true when there was one.
local function failed_forget(fk, id)
  local raw = redis.call('HGET', fk.failed, id)
  redis.call('ZREM', fk.failed_at, id)
  if not raw then return false end
  redis.call('HDEL', fk.failed, id)
  local reason = failed_reason_of(raw)
  if reason and hincrby(fk.failed_by, reason, -1) <= 0 then
    redis.call('HDEL', fk.failed_by, reason)
  end
  return true
end

-- Record the failure of acknowledged entry `id` (record `raw`, checked by failed_check_acks)
-- (or `id` of a record of a request that could not be stored: its parent's entry id and a
-- suffix) with its encoded request `data` (that of the parent for such a record, "" when it
-- has none), at server time `now`; then trim the oldest records past
-- `cap` (0: no cap).  Returns (1, records trimmed).
local function failed_record(fk, id, raw, data, now, cap)
  local rec = cmsgpack.unpack(raw)
  failed_forget(fk, id)  -- (never there for an entry id; kept exact for any other id)
  rec.at = now
  rec.data = data or ''
  redis.call('HSET', fk.failed, id, cmsgpack.pack(rec))
  redis.call('ZADD', fk.failed_at, now, id)
  hincrby(fk.failed_by, rec.reason, 1)
  local trimmed = 0
  if cap and cap > 0 then
    local over = redis.call('ZCARD', fk.failed_at) - cap
    if over > 0 then
      for _, old in ipairs(redis.call('ZRANGE', fk.failed_at, 0, over - 1)) do
        failed_forget(fk, old)
        trimmed = trimmed + 1
      end
    end
  end
  return 1, trimmed
end
