-- step_reply.lua: the frontier call's end: its counters, the previous call's reply cache,
-- this call's reply (cached for a repeat).  Defines one local, step_reply.
--
-- The call's counters go into K.stats.  The previous call's reply cache (K.prev_op) is
-- deleted; when it was gone already (out.pl = 1), its writes may be lost (a failover to a
-- lagging replica), so the worker forgets what it learnt of the filter
-- (frontier/dupecache.py).  The reply is cached in K.op for req.ot ms without its payloads: a
-- call repeated with the same op id returns it before any other step (lua/frontier.lua), and
-- the client rebuilds the payloads from `data` (the entries are still leased with these
-- tokens, since the client has not seen the first reply).
-- Keys (of K): stats, op, prev_op.  Writes: those.
-- Work per call: one HINCRBY per counter that moved, a DEL, a SET.

local function step_reply(c)
  local K, out = c.K, c.out
  for name, n in pairs(c.counters) do
    if n > 0 then hincrby(K.stats, name, n) end
  end
  if K.prev_op ~= K.op and redis.call('DEL', K.prev_op) == 0 then out.pl = 1 end
  local reply = cmsgpack.pack(out)
  local stored = reply
  if #out.leased > 0 then
    local light = {}
    for i, e in ipairs(out.leased) do light[i] = {e[1], e[2], '', e[4]} end
    out.leased = light
    stored = cmsgpack.pack(out)
  end
  redis.call('SET', K.op, stored, 'PX', tonumber(c.req.ot) or 300000)
  return reply
end
