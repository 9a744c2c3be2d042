-- proxies_pool.lua: the proxy pool's state and its reports, the first part of proxies.lua
-- (lua/__init__.py puts it before proxies.lua, whose header gives the keys, the argument and
-- the per (exit, site) state): the pool's key names, the call's argument and server time,
-- the state accessors, ticket release, expired tickets reaped, the back-off and
-- apply_reports.  Writes: site hashes, exits, live, tickets, ticket, stats (through the
-- functions it defines; nothing by itself).
-- Work per call: reap, up to 100 expired tickets; per report, a few HGET/HSET of its exit and
-- site.
local PROXIES, EXITS, REMOVED, LIVE, TAT = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local TICKETS, TICKET, SEQ, SITES, STATS = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

local ok, req = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(req) ~= 'table' or type(req.op) ~= 'string' then
  return redis.error_reply('ERR fleet: bad proxy pool call argument')
end
local now = server_now_ms()

local function split(v, n)
  local out = {}
  if v then
    for part in string.gmatch(v, '([^|]*)|?') do
      out[#out + 1] = part
      if #out >= n then break end
    end
  end
  return out
end

-- indexes of the site state
local OK, BAN, RL, DEAD, SERR, RESP, LAST, UNTIL, PEN, PROBE, FB, LT = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
local NFIELDS = 12

local function site_state(key, id)
  local p = split(redis.call('HGET', key, id), NFIELDS)
  local s = {}
  for i = 1, NFIELDS do s[i] = tonumber(p[i]) or 0 end
  return s
end

local function site_store(key, id, s)
  redis.call('HSET', key, id, table.concat(s, '|'))
end

local function exit_state(id)
  local v = redis.call('HGET', EXITS, id)
  if not v then return nil end
  local p = split(v, 4)
  return {p[1] or 'a', tonumber(p[2]) or 0, tonumber(p[3]) or 0, tonumber(p[4]) or 0}
end

local function exit_store(id, e)
  redis.call('HSET', EXITS, id, e[1] .. '|' .. e[2] .. '|' .. e[3] .. '|' .. e[4])
end

local function ticket_live(t)
  if t == 0 then return false end
  local exp = tonumber(redis.call('ZSCORE', TICKETS, t))
  return exp ~= nil and exp > now
end

local function release_ticket(t)
  -- true when the ticket was still held (its live slot is given back)
  local v = redis.call('HGET', TICKET, t)
  redis.call('ZREM', TICKETS, t)
  if not v then return false end
  redis.call('HDEL', TICKET, t)
  local id = split(v, 3)[1]
  local n = tonumber(redis.call('HINCRBY', LIVE, id, -1)) or 0
  if n <= 0 then redis.call('HDEL', LIVE, id) end
  return true
end

local function reap()
  local expired = redis.call('ZRANGEBYSCORE', TICKETS, '-inf', now, 'LIMIT', 0, 50)
  for _, t in ipairs(expired) do release_ticket(t) end
end

local function backoff(s, j, base, cap)
  local delay = math.min(cap, base * (2 ^ s[PEN])) * j
  s[UNTIL] = now + math.floor(delay)
  s[PEN] = math.min(s[PEN] + 1, 40)
  s[PROBE] = 0
end

local VERDICTS = {ok = 'ok', ban = 'ban', rl = 'rate_limited', dead = 'proxy_dead',
                  serr = 'site_error'}

local function apply_reports(reps)
  if type(reps) ~= 'table' then return 0 end
  local base, cap = tonumber(req.base) or 30000, tonumber(req.cap) or 1800000
  local dead_after, recheck = tonumber(req.dead_after) or 3, tonumber(req.recheck) or 120000
  local applied = 0
  for _, r in ipairs(reps) do
    local key = KEYS[tonumber(r.sk) or 0]
    local id = r.id
    if r.v == 'rel' then  -- no verdict (the request never reached the exit): free the slot
      release_ticket(tonumber(r.t) or 0)
      applied = applied + 1
    elseif key and type(id) == 'string' and VERDICTS[r.v] then
      local t = tonumber(r.t) or 0
      local kind = 0
      local tv = redis.call('HGET', TICKET, t)
      if tv then kind = tonumber(split(tv, 3)[3]) or 0 end
      release_ticket(t)
      hincrby(STATS, VERDICTS[r.v], 1)
      if tonumber(r.r) == 1 then hincrby(STATS, 'responses', 1) end
      local e = exit_state(id)
      if e then  -- an exit removed meanwhile keeps no state
        local s = site_state(key, id)
        if tonumber(r.r) == 1 then s[RESP] = s[RESP] + 1 end
        if s[PROBE] == t then s[PROBE] = 0 end
        if r.v == 'ok' then
          s[OK] = s[OK] + 1
          s[PEN] = math.max(0, s[PEN] - 1)
          -- only the probe's ok brings the exit back for this site: an ok of a request
          -- chosen before the ban (kind 0) is no evidence, even after the cool-down ran out;
          -- the next choice is then the probe
          if kind == 1 then s[UNTIL] = 0 end
          e[2] = 0
          if e[1] == 'x' then e[1] = 'a'; e[3] = 0; hincrby(STATS, 'revived', 1) end
        elseif r.v == 'ban' then
          s[BAN] = s[BAN] + 1
          if s[FB] == 0 then s[FB] = now end
          backoff(s, tonumber(r.j) or 1, base, cap)
          e[2] = 0  -- it answered: not dead
        elseif r.v == 'rl' then
          s[RL] = s[RL] + 1  -- the host's back-off is the politeness middleware's; no cool-down
          e[2] = 0
        elseif r.v == 'dead' then
          s[DEAD] = s[DEAD] + 1
          backoff(s, tonumber(r.j) or 1, base, cap)
          e[2] = e[2] + 1
          if kind == 2 or (e[1] ~= 'x' and e[2] >= dead_after) then
            if e[1] ~= 'x' then hincrby(STATS, 'marked_dead', 1) end
            e[1] = 'x'
            e[3] = now + recheck
          end
        else
          s[SERR] = s[SERR] + 1
        end
        if e[4] == t then e[4] = 0 end
        site_store(key, id, s)
        exit_store(id, e)
      end
      applied = applied + 1
    end
  end
  return applied
end
