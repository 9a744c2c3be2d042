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
-- Metadata hash (KEY meta): n0, p, slices, c0..cN (fingerprints added to each slice).

local LN2SQ = math.log(2) * math.log(2)

local function bloom_slice_params(n0, p, i)
  local n = n0 * (2 ^ i)
  local pi = p * (0.5 ^ i)
  local m = math.ceil(-n * math.log(pi) / LN2SQ)
  local k = math.ceil(-math.log(pi) / math.log(2))
  return n, m, k
end

local function bytes48(s, from)
  local v = 0
  for j = from, from + 5 do
    v = v * 256 + string.byte(s, j)
  end
  return v
end

-- Returns a bloom state table {meta=key, slices={keys}, n0, p, count}.
-- Initialises the metadata with (n0, p) when the filter does not exist yet; an existing
-- filter keeps its own parameters.
local function bloom_open(meta_key, slice_keys, n0, p)
  local stored = redis.call('HMGET', meta_key, 'n0', 'p', 'slices')
  local state = {meta = meta_key, keys = slice_keys}
  if stored[1] then
    state.n0 = tonumber(stored[1])
    state.p = tonumber(stored[2])
    state.count = tonumber(stored[3])
  else
    state.n0 = n0
    state.p = p
    state.count = 0
  end
  return state
end

local function bloom_positions(fp, m, k)
  local h1 = bytes48(fp, 1)
  local h2 = bytes48(fp, 7)
  local pos = {}
  for i = 0, k - 1 do
    pos[#pos + 1] = (h1 + i * h2) % m
  end
  return pos
end

local function bloom_contains(state, fp)
  for s = 0, state.count - 1 do
    local _, m, k = bloom_slice_params(state.n0, state.p, s)
    local all = true
    for _, bit in ipairs(bloom_positions(fp, m, k)) do
      if redis.call('GETBIT', state.keys[s + 1], bit) == 0 then
        all = false
        break
      end
    end
    if all then
      return true
    end
  end
  return false
end

-- Slices are created at their full size: growing a string bit by bit makes Redis
-- over-allocate (up to +1 MB, or x2 below 1 MB).  Larger slices than PREALLOC_MAX bytes are
-- left to grow (building the zero string would cost the script that much memory), and no
-- slice may pass Redis's largest bit offset, 2^32 - 1.
local PREALLOC_MAX = 64 * 1024 * 1024
local MAX_BITS = 4294967296

local function bloom_create_slice(state, s)
  local _, m = bloom_slice_params(state.n0, state.p, s)
  local bytes = math.ceil(m / 8)
  if bytes <= PREALLOC_MAX and redis.call('EXISTS', state.keys[s + 1]) == 0 then
    redis.call('SET', state.keys[s + 1], string.rep('\0', bytes))
  end
end

-- Check-and-add.  Returns 1 when fp was new (and is now added), 0 when it was (probably)
-- seen, and as a second value true when the filter has reached its last slice.
local function bloom_add(state, fp)
  if bloom_contains(state, fp) then
    return 0, false
  end
  if state.count == 0 then
    state.count = 1
    redis.call('HSET', state.meta, 'n0', state.n0, 'p', state.p, 'slices', 1)
    bloom_create_slice(state, 0)
  end
  local s = state.count - 1
  local n, m, k = bloom_slice_params(state.n0, state.p, s)
  for _, bit in ipairs(bloom_positions(fp, m, k)) do
    redis.call('SETBIT', state.keys[s + 1], bit, 1)
  end
  local c = hincrby(state.meta, 'c' .. s, 1)
  local full = false
  if c >= n then
    local _, next_m = bloom_slice_params(state.n0, state.p, state.count)
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
