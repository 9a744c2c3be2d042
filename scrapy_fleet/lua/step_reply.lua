-- step_reply.lua: the frontier call's end: its counters, the previous call's reply cache,
-- this call's reply (cached for a repeat, unless a repeat may run the call again).  Defines
-- two locals, call_replayable and step_reply.
--
-- The call's counters go into K.stats.  The reply is cached in K.op for req.ot ms without
-- its payloads: a call repeated with the same op id (its reply was lost) returns it before
-- any other step (lua/frontier.lua), and the client rebuilds the payloads from `data` (the
-- entries are still leased with these tokens, since the client has not seen the first
-- reply).  The previous call's reply cache (K.prev_op) is deleted; when it was gone already
-- (out.pl = 1), its writes may be lost (a failover to a lagging replica), so the worker
-- forgets what it learnt of the filter (frontier/dupecache.py).
-- A call without events (call_replayable) caches no reply (out.nc = 1; its reply leaves out
-- the lists and counts of events, all empty or 0: the client reads them so): a repeat runs it
-- again, which does only what it did (extensions from the new now, the idle bookkeeping, the
-- heartbeat).  It leaves K.prev_op in place, its expiry renewed (PEXPIRE: it lasts as long
-- as the client calls), and the client keeps naming that op as its previous one
-- (frontier/call.py): the chain of caches stays the evidence that the writes of the client's
-- last cached call survived (out.pl; lua/step_check.lua, ld > 0).  When that cache is gone,
-- the call is cached after all (out.pl = 1), and the chain starts again from it.
-- Keys (of K): stats, op, prev_op.  Writes: those.
-- Work per call: one HINCRBY per counter that moved; a DEL and a SET, or a PEXPIRE (a call
-- without events).

-- (the reply's counts of what the call did)
local REPLY_EVENTS = {'new', 'dup', 'acked', 'released', 'reclaimed', 'dead', 'parked',
                      'deferred', 'resumed', 'refused'}

-- Whether running the call again (same op id) can do no harm: it named nothing a repeat
-- would apply twice (acknowledgements, releases, dead letters, downloads over, pushes,
-- unstorable records, links left out as known duplicates: counted; counter deltas, lua/
-- monitoring.lua: m.applied), and its reply tells nothing that happened (nothing leased or
-- lost, no count, no counter moved: a reclaim, a resumed request, a due revisit...).  Its
-- extensions, take (a repeat may lease what came since: the client saw no lease), the idle
-- bookkeeping and the heartbeat are what any later call does again.
local function call_replayable(c)
  if c.mon.applied or c.local_dups > 0 then return false end
  if not c.ran then return true end  -- (nothing named, no step ran: lua/step_begin.lua)
  local req, out = c.req, c.out
  if #req.a > 0 or #req.r > 0 or #req.d > 0 or #req.s > 0 or #req.p > 0
      or (type(req.u) == 'table' and #req.u > 0) or #out.leased > 0 or #out.lost > 0 then
    return false
  end
  for _, name in ipairs(REPLY_EVENTS) do
    if out[name] ~= 0 then return false end
  end
  for _, n in pairs(c.counters) do
    if n > 0 then return false end
  end
  return true
end

local function step_reply(c)
  local K, out = c.K, c.out
  for name, n in pairs(c.counters) do
    if n > 0 then hincrby(K.stats, name, n) end
  end
  local ttl = tonumber(c.req.ot) or 300000
  if K.prev_op ~= K.op then
    if call_replayable(c) then
      if redis.call('PEXPIRE', K.prev_op, ttl) == 1 then
        -- (the reply without the fields such a call leaves at what the client reads for a
        -- missing one, frontier/protocol.py CallResult: empty lists, counts 0, not full)
        out.leased, out.lost, out.pf, out.rf, out.pd = nil, nil, nil, nil, nil
        out.new, out.dup, out.acked, out.released, out.reclaimed = nil, nil, nil, nil, nil
        out.dead, out.parked, out.deferred, out.resumed, out.refused = nil, nil, nil, nil, nil
        out.full, out.nc = nil, 1
        return cmsgpack.pack(out)
      end
      out.pl = 1
    elseif redis.call('DEL', K.prev_op) == 0 then
      out.pl = 1
    end
  end
  local reply = cmsgpack.pack(out)
  local stored = reply
  if #out.leased > 0 then
    local light = {}
    for i, e in ipairs(out.leased) do light[i] = {e[1], e[2], '', e[4]} end
    out.leased = light
    stored = cmsgpack.pack(out)
  end
  redis.call('SET', K.op, stored, 'PX', ttl)
  return reply
end
