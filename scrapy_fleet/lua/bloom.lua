-- Scalable Bloom filter on plain Redis strings (no module needed).
--
-- Library part: scripts.py prepends this file to the entry scripts that use it
-- (frontier.lua, bloom_add.lua); it defines locals only.
--
-- Follows P. S. Almeida, C. Baquero, N. Preguica, D. Hutchison, "Scalable Bloom Filters",
-- Information Processing Letters 101 (2007): slice i holds n0 * 2^i fingerprints at error
-- rate p * 2^-i (growth s = 2, tightening r = 1/2), so the compound false-positive rate is
-- p while slice 0 is not full and stays below p / (1 - r) = 2p however far the filter grows.
-- Bits per slice m = ceil(-n ln p / ln(2)^2), hash functions k = ceil(-log2 p) (the optimum
-- for a classic Bloom filter), bit positions by double hashing h1 + i*h2 mod m
-- (Kirsch & Mitzenmacher, "Less Hashing, Same Performance", 2006).
--
-- A fingerprint argument is 12 bytes of a uniform hash (the client hashes Scrapy's request
-- fingerprint with BLAKE2b); h1 and h2 are its two 48-bit halves, so every product below
-- stays under 2^53 and double arithmetic is exact.
--
-- Metadata hash (KEY meta): n0, p, slices, c0..cN (fingerprints added to each slice), g (the
-- filter's generation id: set when the filter is created, so a worker that caches which
-- fingerprints are in the filter knows when a purge made a new one).
--
-- Cost per call: one HMGET, then per slice one BITFIELD_RO for all the fingerprints of the
-- call (reads) and one BITFIELD for all the adds (writes), and one HINCRBY of the count:
-- bloom_lookup, bloom_mark (adds), bloom_flush (writes).

local LN2SQ = math.log(2) * math.log(2)
-- BITFIELD subcommands per command (GET takes 3 arguments, SET 4; Lua's unpack stops near
-- 8000 values)
local BITFIELD_CHUNK = 1500

local function bloom_slice_params(n0, p, i)
  local n = n0 * (2 ^ i)
  local pi = p * (0.5 ^ i)
  local m = math.ceil(-n * math.log(pi) / LN2SQ)
  local k = math.ceil(-math.log(pi) / math.log(2))
  return n, m, k
end

-- Returns a bloom state table: meta and slice keys, n0, p, count (slices in use), gen (the
-- filter's generation id, nil until the first add of a filter written before ids existed),
-- params[s] = {n, m, k} of slice s (computed once per call), and the bits to set, per slice.
-- Initialises nothing: an absent filter is created by its first add, with (n0, p); an
-- existing filter keeps its own parameters.
local function bloom_open(meta_key, slice_keys, n0, p)
  local stored = redis.call('HMGET', meta_key, 'n0', 'p', 'slices', 'g')
  local state = {meta = meta_key, keys = slice_keys, params = {}, sets = {}, adds = {},
                 counts = {}}
  if stored[1] then
    state.n0 = tonumber(stored[1])
    state.p = tonumber(stored[2])
    state.count = tonumber(stored[3])
    state.gen = stored[4] or nil
  else
    state.n0 = n0
    state.p = p
    state.count = 0
  end
  return state
end

local function bloom_params(state, s)
  local pr = state.params[s]
  if pr == nil then
    local n, m, k = bloom_slice_params(state.n0, state.p, s)
    pr = {n, m, k}
    state.params[s] = pr
  end
  return pr
end

-- Bit offsets of fp in slice s, appended to out from index at + 1 (returns the new last
-- index): double hashing h1 + i*h2 mod m with the 48-bit halves of fp, so every product
-- stays under 2^53 and double arithmetic is exact.  With prefix (e.g. {'GET', 'u1'}) each
-- offset is preceded by its items: the arguments of a BITFIELD command.
local function bloom_offsets(state, fp, s, out, at, prefix, suffix)
  local pr = state.params[s] or bloom_params(state, s)
  local m, k = pr[2], pr[3]
  local a, b, c, d, e, f = string.byte(fp, 1, 6)
  local h1 = ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
  a, b, c, d, e, f = string.byte(fp, 7, 12)
  local h2 = ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
  local x = h1 % m
  local step = h2 % m
  for _ = 1, k do
    if prefix then
      out[at + 1] = prefix[1]
      out[at + 2] = prefix[2]
      at = at + 2
    end
    at = at + 1
    out[at] = x
    if suffix then
      at = at + 1
      out[at] = suffix
    end
    x = x + step
    if x >= m then x = x - m end
  end
  return at
end

local GET_U1 = {'GET', 'u1'}
local SET_U1 = {'SET', 'u1'}

-- Which of fps (a list of 12-byte strings) are in the filter (as it was before this call's
-- adds)?  Returns a list of booleans.  All the bits one slice needs for the whole list are
-- read with BITFIELD_RO GETs, BITFIELD_CHUNK per command; a fingerprint found in a slice is
-- not looked up in the next ones.
local function bloom_lookup(state, fps)
  local present = {}
  local n = #fps
  for i = 1, n do present[i] = false end
  for s = 0, state.count - 1 do
    local k = bloom_params(state, s)[3]
    local todo, nt = {}, 0
    for i = 1, n do
      if not present[i] then
        nt = nt + 1
        todo[nt] = i
      end
    end
    if nt == 0 then break end
    local per_call = math.max(1, math.floor(BITFIELD_CHUNK / k))
    for from = 1, nt, per_call do
      local to = math.min(nt, from + per_call - 1)
      local args, at = {}, 0
      for j = from, to do
        at = bloom_offsets(state, fps[todo[j]], s, args, at, GET_U1)
      end
      local bits = redis.call('BITFIELD_RO', state.keys[s + 1], unpack(args, 1, at))
      local bi = 0
      for j = from, to do
        local all = true
        for q = bi + 1, bi + k do
          if bits[q] == 0 then
            all = false
            break
          end
        end
        bi = bi + k
        if all then present[todo[j]] = true end
      end
    end
  end
  return present
end

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
    redis.call('HSET', state.meta, 'n0', state.n0, 'p', state.p, 'slices', 1, 'g', state.gen)
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

-- Is fp (probably) in the filter?  (One lookup; bloom_lookup checks many at once.)
local function bloom_contains(state, fp)
  return bloom_lookup(state, {fp})[1]
end
