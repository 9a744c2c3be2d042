-- common.lua: helpers and constants of every script of the fleet (lua/__init__.py puts this
-- file first; it defines locals only).
--
-- Keys: none of its own.  Writes: only the key a caller names (hincrby).
-- Work per call: each helper costs the commands it names, no more.

local FAR = 9e15
-- The pseudo-host of stored responses waiting for a parse worker (FLEET_ROLE, docs/stages.md):
-- no URL's host key can start with "~".  It has no rate, no cap, no robots.txt.
local STAGE_HOST = '~parse'
local PRIO_OFFSET = 1e15
-- |Request.priority| the frontier accepts (frontier/protocol.py PRIORITY_LIMIT): far inside
-- the range the 16-digit queue key and Lua's doubles represent exactly
local PRIORITY_LIMIT = 2147483648

-- HINCRBY that a value not written by the fleet (not an integer) cannot turn into a runtime
-- error after earlier writes (which Redis would keep): such a value is replaced by n, as if
-- the field had been missing.  Returns the new value.
local function hincrby(key, field, n)
  local r = redis.pcall('HINCRBY', key, field, n)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      return redis.call('HINCRBY', key, field, n)  -- another type: raise, never overwrite
    end
    redis.call('HSET', key, field, n)
    return n
  end
  return r
end

-- The Redis server's clock, in ms: the only clock the fleet's limits use.
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Commands with many arguments, sent in chunks (Lua's unpack stops near 8000 values).
local function call_many(cmd, key, args, per)
  for from = 1, #args, per do
    redis.call(cmd, key, unpack(args, from, math.min(#args, from + per - 1)))
  end
end

-- Batched reads: fields of a hash read with one HMGET per 1000 of them; into(field, value)
-- gets each value (false when missing).
local function read_fields(key, fields, into)
  for from = 1, #fields, 1000 do
    local part = {unpack(fields, from, math.min(#fields, from + 999))}
    local vals = redis.call('HMGET', key, unpack(part))
    for i, f in ipairs(part) do into(f, vals[i]) end
  end
end

-- The distinct items of list that memo (item -> value) has no value of yet.
local function unread(list, memo)
  local want, seen = {}, {}
  for _, x in ipairs(list) do
    if memo[x] == nil and not seen[x] then
      seen[x] = true
      want[#want + 1] = x
    end
  end
  return want
end

-- Fields (field -> value, false: delete it) written with one HSET and one HDEL.
local function write_fields(key, values)
  local sets, dels = {}, {}
  for f, v in pairs(values) do
    if v then
      sets[#sets + 1] = f
      sets[#sets + 1] = v
    else
      dels[#dels + 1] = f
    end
  end
  if #sets > 0 then call_many('HSET', key, sets, 4000) end
  if #dels > 0 then call_many('HDEL', key, dels, 4000) end
end

-- Counts (field -> number): those at 0 or below are deleted.
local function write_counts(key, values)
  local fields = {}
  for f, v in pairs(values) do fields[f] = v > 0 and string.format('%d', v) end
  write_fields(key, fields)
end
