-- bloom_write.lua: the adds to the scalable Bloom filter of lua/bloom.lua (a part put after
-- it; it defines locals only): bloom_mark adds a fingerprint known to be absent, bloom_flush
-- writes the bits and counts of a call's adds.
--
-- Keys: the filter's meta and slice keys (bloom_open's state).  Writes: the slices (one
-- BITFIELD per BITFIELD_CHUNK bits; a new slice created at its full size), the meta hash
-- (n0, p, slices, g, v when the filter is created; c<slice> counts).
-- Work per call: one BITFIELD per slice written (per BITFIELD_CHUNK bits) and one HINCRBY of
-- its count; a new slice costs one SET of its size.

-- Slices are created at their full size: growing a string bit by bit makes Redis
-- over-allocate (up to +1 MB, or x2 below 1 MB).  Larger slices than PREALLOC_MAX bytes are
-- left to grow (building the zero string would cost the script that much memory), and no
-- slice may pass Redis's largest bit offset, 2^32 - 1.
local PREALLOC_MAX = 64 * 1024 * 1024
local MAX_BITS = 4294967296

local function bloom_create_slice(state, s)
  local m = bloom_params(state, s)[2]
  local bytes = math.ceil(m / 8)
  if bytes <= PREALLOC_MAX and redis.call('EXISTS', state.keys[s + 1]) == 0 then
    redis.call('SET', state.keys[s + 1], string.rep('\0', bytes))
  end
end

-- A new generation id: the server's TIME in microseconds (calls never share one).
local function bloom_new_gen()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- Add fp, known to be absent (bloom_lookup, and not added earlier in this call), to the
-- current slice; its bits are written by bloom_flush.  Returns true as a second value when
-- the filter has reached its last slice.
local function bloom_mark(state, fp)
  if state.count == 0 then
    state.count = 1
    state.gen = bloom_new_gen()
    redis.call('HSET', state.meta, 'n0', state.n0, 'p', state.p, 'slices', 1, 'g', state.gen,
               'v', state.v)
    bloom_create_slice(state, 0)
  elseif state.gen == nil then
    state.gen = bloom_new_gen()  -- a filter of the previous format: give it an id now
    redis.call('HSET', state.meta, 'g', state.gen)
  end
  local s = state.count - 1
  if state.counts[s] == nil then
    state.counts[s] = tonumber(redis.call('HGET', state.meta, 'c' .. s)) or 0
  end
  local sets = state.sets[s]
  if sets == nil then
    sets = {n = 0}
    state.sets[s] = sets
  end
  sets.n = bloom_offsets(state, fp, s, sets, sets.n, SET_U1, 1)
  state.adds[s] = (state.adds[s] or 0) + 1
  local full = false
  if state.counts[s] + state.adds[s] >= bloom_params(state, s)[1] then
    local next_m = bloom_params(state, state.count)[2]
    if state.count < #state.keys and next_m <= MAX_BITS then
      state.count = state.count + 1
      redis.call('HSET', state.meta, 'slices', state.count)
      bloom_create_slice(state, state.count - 1)
    else
      full = true
    end
  end
  return 1, full
end

-- Write the bits and counts of this call's adds (one BITFIELD per BITFIELD_CHUNK bits).
local function bloom_flush(state)
  for s, args in pairs(state.sets) do
    local per = BITFIELD_CHUNK * 4
    for from = 1, args.n, per do
      redis.call('BITFIELD', state.keys[s + 1], unpack(args, from, math.min(args.n, from + per - 1)))
    end
    hincrby(state.meta, 'c' .. s, state.adds[s])
  end
  state.sets, state.adds = {}, {}
end
