-- control.lua: a control command's write (issue 34, commands/control.py, docs/control.md),
-- on one frontier (each partition of a partitioned crawl gets the same write).
--
-- Keys (of K, keys.CONTROL_CALL): ctl, control, ctlhosts, ready, hostq, ctlhostconf.
-- ARGV: op (pause, resume, hpause, block, hresume, hconf, hclear), gen (the generation the
-- command proposes: the one written is max(this, stored + 1)), for ms (0: until resumed or
-- unblocked), by, why, then the hosts (host operations).
-- pause/resume: the crawl's pause in K.control {gen, until, by, at, why}; hpause/block: each
-- host in K.ctlhosts "<until>|<kind>|<by>|<at>|<why>"; hresume: each host out of it, and
-- back in K.ready now when it has queued entries (a paused host was put there at FAR or at
-- its end); hconf: a host's live override in K.ctlhostconf (host set, lua/hosts.lua), merged
-- part by part with the one there; hclear: it removed.  Paused hosts whose time is over are
-- dropped.  Then K.ctl, the summary every
-- frontier call reads (lua/step_control.lua).
-- Reply: {gen, now ms, until}.
-- Work: one command per host named, an HGETALL of the paused hosts.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gen, untl = 0, -1
local raw = redis.call('GET', K.ctl)
if raw then
  local g, u = string.match(raw, '^(%d+)|(%-?%d+)|')
  gen, untl = tonumber(g) or 0, tonumber(u) or -1
end
gen = math.max(gen + 1, tonumber(ARGV[2]) or 0)
local op, for_ms, by, why = ARGV[1], tonumber(ARGV[3]) or 0, ARGV[4], ARGV[5]
local ends = for_ms > 0 and now + for_ms or 0
if op == 'pause' or op == 'resume' then
  untl = op == 'pause' and ends or -1
  redis.call('HSET', K.control, 'gen', gen, 'until', untl, 'by', by, 'at', now, 'why', why)
elseif op == 'hpause' or op == 'block' then
  local value = string.format('%d|%s|%s|%d|%s', ends, op == 'block' and 'block' or 'pause',
                              by, now, why)
  for i = 6, #ARGV do redis.call('HSET', K.ctlhosts, ARGV[i], value) end
elseif op == 'hconf' then
  -- host set: ARGV[6] the host, ARGV[7] "T|burst|cap|rate" (empty parts: keep the override's)
  local old = redis.call('HGET', K.ctlhostconf, ARGV[6]) or '|||'
  local parts, i = {}, 0
  for o in string.gmatch(old .. '|', '([^|]*)|') do
    i = i + 1
    parts[i] = o
  end
  i = 0
  for n in string.gmatch(ARGV[7] .. '|', '([^|]*)|') do
    i = i + 1
    if n ~= '' then parts[i] = n end
  end
  redis.call('HSET', K.ctlhostconf, ARGV[6], table.concat(parts, '|', 1, 4))
  redis.call('ZADD', K.ready, 'LT', now, ARGV[6])  -- (a new rate may let it go sooner)
  if (tonumber(redis.call('HGET', K.hostq, ARGV[6])) or 0) == 0 then
    redis.call('ZREM', K.ready, ARGV[6])
  end
elseif op == 'hclear' then
  redis.call('HDEL', K.ctlhostconf, ARGV[6])
  if (tonumber(redis.call('HGET', K.hostq, ARGV[6])) or 0) > 0 then
    redis.call('ZADD', K.ready, 'LT', now, ARGV[6])
  end
elseif op == 'hresume' then
  for i = 6, #ARGV do
    if redis.call('HDEL', K.ctlhosts, ARGV[i]) == 1
        and (tonumber(redis.call('HGET', K.hostq, ARGV[i])) or 0) > 0 then
      redis.call('ZADD', K.ready, 'LT', now, ARGV[i])
    end
  end
else
  return redis.error_reply('ERR fleet: unknown control operation ' .. tostring(op))
end
local all = redis.call('HGETALL', K.ctlhosts)
for i = 1, #all, 2 do
  local u = tonumber(string.match(all[i + 1], '^(%-?%d+)'))
  if u ~= 0 and (not u or u <= now) then redis.call('HDEL', K.ctlhosts, all[i]) end
end
redis.call('SET', K.ctl, string.format('%d|%d|%d', gen, untl, redis.call('HLEN', K.ctlhosts)))
return {gen, now, untl}
