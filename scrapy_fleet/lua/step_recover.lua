-- step_recover.lua: a dead worker's leases back in the frontier within seconds of its death,
-- instead of at their FLEET_LEASE_TIMEOUT (issue 30; docs/architecture.md, "Recovery").
-- Defines four locals: recover_gap, recover_due, recover_floor and recover_predecessor.
--
-- Every worker that took leases is in K.holders, scored by its last sign of life (ms, Redis's
-- clock): its frontier calls with work (lua/step_idle.lua) and a beat from a thread of its
-- own that keeps running while its reactor is busy in a slow callback (lua/beat.lua, every
-- FLEET_WORKER_DEAD_AFTER / 5 s).  K.held holds each lease under its holder
-- ("<worker>\t<entry id>", score 0: a lex range is one worker's leases), written with the
-- lease (lua/step_lease.lua) and removed with it (lua/frontier_state.lua, drop_lease).
-- A holder silent for req.wd ms (FLEET_WORKER_DEAD_AFTER, sent by workers only) is dead: its
-- leases are reclaimed as expired ones are (lua/step_reclaim.lua: back to the head of their
-- bucket, counted in K.expiries towards FLEET_MAX_LEASES, so a page that kills its worker
-- each time ends in the dead letters).  Fencing is unchanged: the dead worker, if it was only
-- stopped, finds its tokens stale and acknowledges nothing it held.
-- Silence counts from K.alive_from at the earliest.  recover_gap(c), on every call of a
-- worker, sets it to now when no worker had reached this Redis for req.wd ms before this call
-- (mon's lw, the last worker call or beat, as lua/monitoring.lua read it): an outage of Redis
-- itself (or a freeze) then gives every worker req.wd ms from its end to beat again, instead
-- of making them all dead at once.  lua/beat.lua does the same.
-- recover_due(c, room), run when lua/step_begin.lua's bound has passed: c.recover, the
-- leases of dead holders (at most *room*: {{id, worker}...}; the caller is never dead to
-- itself), and returns the floor of this part of the bound: when the next holder may be
-- dead, or nil when not known (recover_floor reads it after the steps).  A dead holder
-- without leases leaves K.holders.
-- Keys (of K): holders, held, alive_from (read with the call's head, c.head[8]), mon (lw,
-- read by lua/monitoring.lua).  Writes: alive_from (after a gap), holders (ZREM of a dead
-- holder with no lease left).
-- Work per call: a SET after a gap; when the bound passed and req.wd > 0: one ZRANGE of the
-- first RECOVER_PEEK holders, and a ZRANGEBYLEX per dead holder (at most RECOVER_PEEK); one
-- ZRANGEBYLEX on a worker's first call (recover_predecessor).

local RECOVER_PEEK = 4
local RECOVER_NONE = 9e15  -- (no holder: none can die; lua/step_begin.lua's NEXT_DUE_NONE)

local function recover_gap(c)
  c.dead_ms = tonumber(c.req.wd) or 0
  c.alive_from = tonumber(c.head[8])
  if c.worker == '' or c.dead_ms <= 0 then return end
  -- (lw is written at most every da / 4 ms, lua/monitoring.lua: a call without da, one to a
  -- partition other than the worker's home, writes it as often)
  if c.mon.da == nil then c.mon.da = c.dead_ms end
  local lw = tonumber(c.mon.last and c.mon.last[5])
  if not lw or c.now - lw > c.dead_ms then
    redis.call('SET', c.K.alive_from, string.format('%d', c.now))
    c.alive_from = c.now
  end
end

local function recover_due(c, room)
  local K, now, wd = c.K, c.now, c.dead_ms
  c.recover = {}
  if wd <= 0 then return RECOVER_NONE end
  local from = c.alive_from or 0
  local first = redis.call('ZRANGE', K.holders, 0, RECOVER_PEEK - 1, 'WITHSCORES')
  local floor, unknown = RECOVER_NONE, #first >= 2 * RECOVER_PEEK
  for i = 1, #first, 2 do
    local who = first[i]
    local dead_at = math.max(tonumber(first[i + 1]) or 0, from) + wd
    if who == c.worker then
      floor = math.min(floor, now + wd)  -- (this call is its sign of life: lua/step_idle.lua)
    elseif dead_at > now then
      return math.min(floor, dead_at)  -- (the holders after it beat later)
    elseif room <= #c.recover then
      return nil
    else
      local held = redis.call('ZRANGEBYLEX', K.held, '[' .. who .. '\t',
                              '[' .. who .. '\t\255', 'LIMIT', 0, room - #c.recover)
      if #held == 0 then
        redis.call('ZREM', K.holders, who)
      else
        for _, m in ipairs(held) do
          c.recover[#c.recover + 1] = {string.sub(m, #who + 2), who}
        end
        unknown = true  -- (it leaves K.holders once a later call finds none left)
      end
    end
  end
  if unknown then return nil end
  return floor
end

-- The floor after the steps (recover_due returned nil): when the first holder may be dead.
local function recover_floor(c)
  if c.dead_ms <= 0 then return RECOVER_NONE end
  local first = redis.call('ZRANGE', c.K.holders, 0, 0, 'WITHSCORES')
  if not first[2] then return RECOVER_NONE end
  return math.max(tonumber(first[2]), c.alive_from or 0) + c.dead_ms
end

-- A worker's first call (req.nw = 1: its client has not seen the crawl marker yet) holds no
-- lease: the
-- leases filed under its id are a predecessor's, a process that died with the same
-- FLEET_WORKER_ID (a restart; identity.py lets a new process have the id only once the old
-- one is dead), whose beats the new one would otherwise keep alive.  They join c.recover (at
-- most *room*).
local function recover_predecessor(c, room)
  local who = c.worker
  if who == '' or c.dead_ms <= 0 or tonumber(c.req.nw) ~= 1 or room <= 0 then return end
  local held = redis.call('ZRANGEBYLEX', c.K.held, '[' .. who .. '\t', '[' .. who .. '\t\255',
                          'LIMIT', 0, room)
  for _, m in ipairs(held) do c.recover[#c.recover + 1] = {string.sub(m, #who + 2), who} end
end
