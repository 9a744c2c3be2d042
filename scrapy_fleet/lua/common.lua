-- Helpers for every script (library part: scripts.py prepends it; it defines locals only).

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
