-- step_begin.lua: the frontier call's start, after its checks: the server's time, the crawl
-- marker (and the layout version with it), the per-host context, the reply, the queue writer
-- and the call's state.  Defines one local, begin_call.
--
-- begin_call(c) sets c.now (the Redis server's TIME, ms: the only clock of every step),
-- c.ctx (lua/hosts.lua), c.out (the reply map), c.count(name, n) (the call's counters, added
-- to stats by step_reply), c.qw (lua/queue.lua's writer) and c.st (lua/frontier_state.lua).
-- Keys (of K): marker, layout (SET once, with the marker: the crawl's first push or first
-- worker call; frontier/layout.py refuses a crawl of another layout at start), hostconf,
-- crawldelay, hold (EXISTS, when a step first asks: an empty one is not read per host).
-- Writes: marker and layout, once per crawl.  Work per call: 1 command (TIME).

local function begin_call(c)
  local K, req = c.K, c.req
  c.now = server_now_ms()
  local marker = failed_ensure_marker(K.marker, c.marker, req.mc)
  if marker and not c.marker then redis.call('SET', K.layout, CRAWL_LAYOUT) end
  local ctx = new_host_ctx(c.now, K.tat, K.hold, K.hostlive, K.hostconf, K.crawldelay, req)
  ctx.memo = {}  -- per-host fields read once per call (hosts.lua, ctx_get)
  -- per-host hashes without any field (hostconf, crawldelay, hold: no call writes them), not
  -- read per host: each looked at (EXISTS) the first time a step asks, so that a call that
  -- asks none (no lease, no hold) sends none
  local lazy = {[K.hostconf] = true, [K.crawldelay] = true, [K.hold] = true}
  ctx.empty = setmetatable({}, {__index = function(t, key)
    if not lazy[key] then return nil end
    local v = redis.call('EXISTS', key) == 0
    rawset(t, key, v)
    return v
  end})
  c.ctx = ctx
  c.out = {leased = {}, lost = {}, pf = {}, rf = {}, pd = {}, new = 0, dup = 0, acked = 0,
           released = 0, reclaimed = 0, dead = 0, parked = 0, deferred = 0, resumed = 0,
           refused = 0, full = false, now = c.now, mk = marker or ''}
  local counters = {}
  c.counters = counters
  function c.count(name, n)
    counters[name] = (counters[name] or 0) + n
  end
  local st
  c.qw = Queue.writer(K, c.now, function(id, host) st.to_dead(id, 'entry has no data', host) end,
                      tonumber(c.head[3]) or 0)
  st = State.new(c)
  c.st = st
end
