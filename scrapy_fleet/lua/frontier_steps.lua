-- frontier_steps.lua: the body of frontier_steps(c), the frontier call's steps, run by
-- lua/frontier.lua when the call has work (lua/step_begin.lua, call_has_work).  lua/__init__.py
-- puts it, after the steps' parts (GROUPS), inside `local function frontier_steps(c)`, so
-- that their closures are created only by a call that runs them.
--
-- Sets c.ctx (lua/hosts.lua: the per-host context), c.qw (lua/queue.lua's writer), c.st
-- (lua/frontier_state.lua), runs the steps, flushes the per-host counts and slots, and sets
-- c.queued (the queued count after the steps).
-- Keys (of K): hostconf, crawldelay, hold (EXISTS, when a step first asks: an empty one is
-- not read per host), and the steps'.  Writes: the steps'.
-- Work per call: the sum of its steps' bounds (each step's header).

local K, req = c.K, c.req
local ctx = new_host_ctx(c.now, K.tat, K.hold, K.hostlive, K.hostconf, K.crawldelay, req)
ctx.memo = {}  -- per-host fields read once per call (hosts.lua, ctx_get)
if req.ad == 1 then ctx.adaptive = K.adaptive end  -- adaptive politeness (lua/adaptive.lua)
if c.ctl then ctx.live = K.ctlhostconf end  -- crawl control's `host set` (lua/step_control.lua)
-- per-host hashes without any field (hostconf, crawldelay, hold, adaptive: few calls write
-- them), not read per host: each looked at (EXISTS) the first time a step asks, so that a call that
-- asks none (no lease, no hold) sends none
local lazy = {[K.hostconf] = true, [K.crawldelay] = true, [K.hold] = true,
              [K.adaptive] = true, [K.ctlhostconf] = true}
ctx.empty = setmetatable({}, {__index = function(t, key)
  if not lazy[key] then return nil end
  local v = redis.call('EXISTS', key) == 0
  rawset(t, key, v)
  return v
end})
c.ctx = ctx
local st
c.qw = Queue.writer(K, c.now, function(id, host) st.to_dead(id, 'entry has no data', host) end,
                    c.queued)
st = State.new(c)
c.st = st

step_due(c)
step_reclaim(c)
step_release(c)
step_adapt(c)  -- adaptive politeness (issue 35): the download reports, before their slots go
step_extend(c)
step_push(c)
step_ack(c)
step_revisit_due(c)  -- recrawl (issue 22): due revisits into the queue (lua/step_revisit.lua)
step_lease(c)
st.flush_hostq()
st.flush_slots()
c.queued = c.qw.queued
