-- step_check.lua: the frontier call's argument, checked whole before the call's first write
-- (a runtime error after a write keeps the earlier writes; OOM is only checked before the
-- first write).  Defines check_call, and the cache of ARGV[3] it reads (call_constants).
--
-- check_call(K, head) returns the call `c` (c.req: ARGV[1] with its lists defaulted: a list
-- left out is one read-only empty table shared by every call; c.mon:
-- ARGV[2] parsed, c.marker: the crawl marker as read, c.head: what lua/frontier.lua read
-- first {reply cache, marker, queued count, idle since}, and the call's parameters), or nil
-- and the error message.  frontier/protocol.py documents ARGV[1]'s fields (lua/frontier.lua
-- names them too).
-- Keys (of K): bloom_meta and prev_op (only when the worker left out known duplicates: ld >
-- 0), the monitoring keys (TYPE, lua/monitoring.lua); the marker as read in head.  Writes:
-- nothing.  Work per call: 2 commands (4 with per-host deltas, 2 more with ld > 0), and one
-- pass over the call's lists.

-- ARGV[3] (optional): the call's constants (frontier/protocol.py call_config: lease, Bloom,
-- bounds, politeness and lease-host parameters), one msgpack map of strings and numbers that
-- a client sends unchanged call after call; ARGV[1]'s fields come before its (it is ARGV[1]'s
-- metatable's __index).  Each distinct ARGV[3] is unpacked and checked once while the chunk
-- lives (CALL_CONSTANTS: the Functions library's, lua/library.py, until it is loaded again;
-- one call's for an EVALSHA): a cache, bounded (emptied at CALL_CONSTANTS_MAX values),
-- whose metatables are never written to.
local CALL_CONSTANTS, CALL_CONSTANTS_MAX = {n = 0, v = {}}, 64
local CALL_LISTS = {'a', 'r', 'd', 'x', 'p', 's'}
-- (a list ARGV[1] leaves out: one empty table for every call, which no step writes to; made
-- read only by the first call: a library's code calls nothing when it is loaded)
local NO_ENTRIES, no_entries_sealed = {}, false

local function call_constants(raw)
  local meta = CALL_CONSTANTS.v[raw]
  if meta then return meta end
  local ok, cst = pcall(cmsgpack.unpack, raw)
  if not ok or type(cst) ~= 'table' then return nil end
  for k, v in pairs(cst) do
    if type(k) ~= 'string' or (type(v) ~= 'string' and type(v) ~= 'number') then return nil end
  end
  if CALL_CONSTANTS.n >= CALL_CONSTANTS_MAX then CALL_CONSTANTS.v, CALL_CONSTANTS.n = {}, 0 end
  meta = {__index = cst}
  CALL_CONSTANTS.v[raw] = meta
  CALL_CONSTANTS.n = CALL_CONSTANTS.n + 1
  return meta
end

local function check_call(K, head)
  local ok, req = pcall(cmsgpack.unpack, ARGV[1])
  if not ok or type(req) ~= 'table' then
    return nil, 'ERR fleet: bad frontier call argument'
  end
  if ARGV[3] ~= nil and ARGV[3] ~= '' then
    local meta = call_constants(ARGV[3])
    if not meta then return nil, 'ERR fleet: bad frontier call constants' end
    setmetatable(req, meta)
  end
  if not no_entries_sealed then
    setmetatable(NO_ENTRIES, {__newindex = function()
      error('fleet: a call list left out is read only')
    end})
    no_entries_sealed = true
  end
  for _, name in ipairs(CALL_LISTS) do
    if req[name] == nil then req[name] = NO_ENTRIES end
    if type(req[name]) ~= 'table' then
      return nil, 'ERR fleet: field ' .. name .. ' must be a list'
    end
  end
  -- monitoring (lua/monitoring.lua): checked here, applied at the end
  local mon, mon_err = monitor_parse(ARGV[2], K)
  if not mon then return nil, 'ERR fleet: ' .. mon_err end
  local n_acks = #req.a
  local bad_failure = failed_check_acks(req.a, req.u)
  if bad_failure then return nil, 'ERR fleet: ' .. bad_failure end
  local marker_error, marker = failed_check_marker(K.marker, req.mk, head[2])
  if marker_error then return nil, marker_error end
  if #req.p > 0 and K.bloom_slices[1] == nil then
    -- (a call without pushes may leave the Bloom slices out of its KEYS: keys.frontier_keys)
    return nil, 'ERR fleet: a call with pushes must name the Bloom slices'
  end
  for _, p in ipairs(req.p) do
    if type(p) ~= 'table' or type(p[1]) ~= 'string' or type(p[2]) ~= 'number'
        or p[2] ~= p[2] or math.abs(p[2]) > PRIORITY_LIMIT
        or type(p[3]) ~= 'string' or (p[1] ~= '' and #p[1] ~= 12)
        or type(p[4]) ~= 'number' or p[4] < 0 or p[4] > n_acks or type(p[5]) ~= 'string'
        or (p[6] ~= nil and (type(p[6]) ~= 'number' or p[6] ~= p[6] or p[6] < 0))
        or (p[7] ~= nil and (type(p[7]) ~= 'number' or p[7] ~= p[7] or p[7] < 0)) then
      return nil, 'ERR fleet: bad push entry'
    end
  end
  local local_dups = tonumber(req.ld) or 0
  if local_dups > 0 then
    -- the worker's knowledge holds only for this filter (generation g) in a state that has
    -- every write of the worker's previous cached call (K.prev_op, its reply cache, still
    -- there; a call without events caches none and leaves it, lua/step_reply.lua): a
    -- failover to a replica that lacked that call's writes rolled the filter back, and
    -- replication is in order, so that key is the one to look at (an expired one, after 5 min
    -- without a call, only costs a full call)
    local gen = redis.call('HGET', K.bloom_meta, 'g')
    if not gen or gen ~= tostring(req.bg) or redis.call('EXISTS', K.prev_op) == 0 then
      return nil, 'ERR fleet: stale filter generation'
    end
  end
  return {K = K, req = req, mon = mon, marker = marker, head = head, local_dups = local_dups,
          take = tonumber(req.t) or 0, lease_ms = tonumber(req.lm) or 30000,
          max_leases = tonumber(req.ml) or 3, queue_max = tonumber(req.qm) or 0,
          host_max = tonumber(req.hm) or 0, defer_ms = tonumber(req.dd) or 10000,
          worker = req.w or ''}
end
