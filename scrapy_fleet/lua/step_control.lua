-- step_control.lua: crawl control (issue 34, docs/control.md): the crawl's pause and its
-- paused or blocked hosts, state that every frontier call reads atomically (no flag a worker
-- polls).  Defines four locals: control_read, control_paused, control_hosts, control_reply.
--
-- K.ctl ("<gen>|<until>|<hosts>", written only by lua/control.lua, the commands) is read
-- with the call's head (c.head[9]); missing, no control was ever used and nothing here
-- costs a command.  until: -1 running, 0 paused until resumed, else paused until that server
-- time (ms: Redis's clock, so `--for` ends without any worker's clock).
-- control_read(c): c.ctl = {gen, left (-1 running, 0 until resumed, else ms), nh}; a paused
-- crawl leases nothing (c.take = 0: pushes, acknowledgements, releases and extensions go on);
-- records the generation the worker reports holding (req.cg) in K.ctlseen.
-- control_paused(c): the crawl is paused (lua/step_idle.lua: a paused crawl is not idle).
-- control_hosts(c, hosts): of *hosts*, those paused or blocked now -> the server time they
-- may be leased again (FAR: until unblocked), nil when none is (lua/step_lease.lua puts them
-- where a host on hold goes: back into K.ready at that time).
-- control_reply(c): out.cz = {gen, left, {{host, ms left (0: until unblocked)}...}}, what
-- the worker holds until its next call (its downloads wait while paused:
-- frontier/control.py).
-- Keys (of K): ctl (in the head's MGET), ctlhosts, ctlseen.  Writes: ctlseen.
-- Work per call: nothing without K.ctl; else one HSET when the worker reports a generation,
-- an HMGET of the candidate hosts in the lease step and an HGETALL of the paused hosts (few:
-- an operator names each) when any is paused.

local function control_read(c)
  local raw = c.head[9]
  if not raw then return end
  local gen, untl, nh = string.match(raw, '^(%d+)|(%-?%d+)|(%d+)$')
  gen, untl, nh = tonumber(gen) or 0, tonumber(untl) or -1, tonumber(nh) or 0
  local left = -1
  if untl == 0 then
    left = 0
  elseif untl > c.now then
    left = untl - c.now
  end
  c.ctl = {gen = gen, left = left, nh = nh}
  if left >= 0 then c.take = 0 end
  local cg = tonumber(c.req.cg)
  if cg and c.worker ~= '' then redis.call('HSET', c.K.ctlseen, c.worker, cg) end
end

local function control_paused(c)
  return c.ctl ~= nil and c.ctl.left >= 0
end

-- The server time (ms) until which a ctlhosts value pauses its host (FAR: until unblocked),
-- nil when it does not (any more).
local function control_host_until(value, now)
  local u = value and tonumber(string.match(value, '^(%-?%d+)'))
  if u == 0 then return FAR end
  if u and u > now then return u end
  return nil
end

local function control_hosts(c, hosts)
  local ctl = c.ctl
  if not ctl or ctl.nh == 0 or #hosts == 0 then return nil end
  local vals = redis.call('HMGET', c.K.ctlhosts, unpack(hosts))
  local paused, any = {}, false
  for i, h in ipairs(hosts) do
    local u = control_host_until(vals[i], c.now)
    if u then
      paused[h] = u
      any = true
    end
  end
  return any and paused or nil
end

local function control_reply(c)
  local ctl = c.ctl
  if not ctl then return end
  local hosts = {}
  if ctl.nh > 0 then
    local all = redis.call('HGETALL', c.K.ctlhosts)
    for i = 1, #all, 2 do
      local u = control_host_until(all[i + 1], c.now)
      if u then hosts[#hosts + 1] = {all[i], u == FAR and 0 or u - c.now} end
    end
  end
  c.out.cz = {ctl.gen, ctl.left, hosts}
end
