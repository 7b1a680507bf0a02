-- ratekeeper limiter, state format v1: twins of ratekeeper_core::algorithm::Gcra (also the
-- leaky-bucket meter) and ::FixedWindow, in integer µs, with the state layouts documented in
-- ratekeeper_core::algorithm.
--
-- KEYS[i]   one key per (policy, client key); all KEYS share one hash tag (one Cluster slot).
--           GCRA: the theoretical arrival time (TAT) in µs; absent = 0.
--           Fixed window: "<window>:<count>" with window = floor(t / W); absent = count 0.
--           Sliding window counter: "<window>:<current>:<previous>"; absent = both counts 0.
-- ARGV[1]   injected "now" in µs, or '' to read Redis TIME.
-- ARGV[2]   stale deadline in Unix µs (Redis TIME domain), or '': a call that reaches Redis
--           after it does nothing and returns {-1} (its caller already gave up on it).
-- ARGV[3]   'check' (all-or-nothing charge), 'peek' (no write) or 'refund'.
-- ARGV[4]   least PX of a write in ms ('0': none; see RedisStoreBuilder::min_ttl).
-- ARGV[5+5(i-1) .. 9+5(i-1)]  algorithm, p1, p2, p3, cost, where algorithm 1 = GCRA
--           (p1 = T, the emission interval in µs; p2 = tau = burst * T in µs; p3 = burst) and
--           2 = fixed window and 3 = sliding window counter (p1 = W, the window in µs;
--           p2 = limit; p3 unused). The Rust side keeps 2 * limit * W below 2^53, so every
--           product here is an exact double.
--
-- Returns four integers per key: code (0 allowed, 1 denied, 2 cannot fit), remaining,
-- reset_after (µs) and retry_after (µs, 0 unless denied).
-- Every write sets PX to the time until the state equals "absent" (GCRA: TAT - now; fixed
-- window: until the window ends), rounded up to a ms, and at least ARGV[4] ms; a state equal
-- to "absent" is deleted.
local clock = redis.call('TIME')
local server_now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
if ARGV[2] ~= '' and server_now > tonumber(ARGV[2]) then
  return {-1}
end
local now = server_now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
end
local mode = ARGV[3]
local min_ttl = tonumber(ARGV[4]) or 0
local n = #KEYS

local function param(i, j)
  return tonumber(ARGV[4 + (i - 1) * 5 + j])
end
local function algo(i)
  return param(i, 1)
end
local function cost_of(i)
  return param(i, 5)
end

-- cache[key] holds the state: a number (GCRA TAT) or {window, count} (fixed window).
local cache = {}
local function load(i)
  local key = KEYS[i]
  local v = cache[key]
  if v == nil then
    local raw = redis.call('GET', key)
    if algo(i) == 2 then
      local w, c = 0, 0
      if raw then
        local a, b = string.match(raw, '^(%d+):(%d+)$')
        w, c = tonumber(a) or 0, tonumber(b) or 0
      end
      v = {w, c}
    elseif algo(i) == 3 then
      local w, c, p = 0, 0, 0
      if raw then
        local a, b, d = string.match(raw, '^(%d+):(%d+):(%d+)$')
        w, c, p = tonumber(a) or 0, tonumber(b) or 0, tonumber(d) or 0
      end
      v = {w, c, p}
    else
      v = raw and tonumber(raw) or 0
    end
    cache[key] = v
  end
  return v
end

local function fw_current(i, st)
  local w = math.floor(now / param(i, 2))
  if st[1] == w then
    return {w, math.min(st[2], param(i, 3))}
  end
  return {w, 0}
end

local function fw_until_end(i, w)
  return (w + 1) * param(i, 2) - now
end

-- Sliding window counter: {window, current, previous}.
local function sw_current(i, st)
  local w = math.floor(now / param(i, 2))
  local cap = param(i, 3)
  if st[1] == w then
    return {w, math.min(st[2], cap), math.min(st[3], cap)}
  elseif st[1] + 1 == w then
    return {w, 0, math.min(st[2], cap)}
  end
  return {w, 0, 0}
end

local function sw_elapsed(i, st)
  return now - st[1] * param(i, 2)
end

local function sw_earliest(i, previous, current, cost)
  local room = param(i, 3) - current - cost
  if room < 0 then
    return nil
  end
  if previous == 0 then
    return 0
  end
  local w = param(i, 2)
  return math.max(w - math.floor(room * w / previous), 0)
end

local function sw_reset(i, st)
  local windows_left = 0
  if st[2] > 0 then
    windows_left = 2
  elseif st[3] > 0 then
    windows_left = 1
  end
  return math.max(windows_left * param(i, 2) - sw_elapsed(i, st), 0)
end

local function store(i, st)
  local key = KEYS[i]
  if algo(i) == 3 then
    if st[2] <= 0 and st[3] <= 0 then
      redis.call('DEL', key)
    else
      redis.call('SET', key, string.format('%.0f:%.0f:%.0f', st[1], st[2], st[3]), 'PX',
        string.format('%.0f', math.max(1, min_ttl, math.ceil(sw_reset(i, st) / 1000))))
    end
  elseif algo(i) == 2 then
    if st[2] <= 0 then
      redis.call('DEL', key)
    else
      redis.call('SET', key, string.format('%.0f:%.0f', st[1], st[2]), 'PX',
        string.format('%.0f', math.max(1, min_ttl, math.ceil(fw_until_end(i, st[1]) / 1000))))
    end
  elseif st <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.0f', st), 'PX',
      string.format('%.0f', math.max(min_ttl, math.ceil((st - now) / 1000))))
  end
end

-- The current state (GCRA: max(stored, now); fixed window: rolled to this window).
local function current(i)
  local st = load(i)
  if algo(i) == 2 then
    return fw_current(i, st)
  elseif algo(i) == 3 then
    return sw_current(i, st)
  end
  return math.max(st, now)
end

-- verdict for the current state: code, new state (nil = no change), retry_after
local function verdict(i, st)
  local cost = cost_of(i)
  if algo(i) == 3 then
    local limit, w = param(i, 3), param(i, 2)
    if cost > limit then
      return 2, nil, 0
    end
    if cost == 0 then
      return 0, nil, 0
    end
    local elapsed = sw_elapsed(i, st)
    if st[3] * (w - elapsed) + (st[2] + cost) * w <= limit * w then
      return 0, {st[1], st[2] + cost, st[3]}, 0
    end
    local e = sw_earliest(i, st[3], st[2], cost)
    if e then
      return 1, nil, math.max(e, elapsed) - elapsed
    end
    return 1, nil, (w - elapsed) + (sw_earliest(i, st[2], 0, cost) or w)
  end
  if algo(i) == 2 then
    local limit = param(i, 3)
    if cost > limit then
      return 2, nil, 0
    end
    if cost == 0 then
      return 0, nil, 0
    end
    if cost <= limit - st[2] then
      return 0, {st[1], st[2] + cost}, 0
    end
    return 1, nil, fw_until_end(i, st[1])
  end
  local t, tau, burst = param(i, 2), param(i, 3), param(i, 4)
  if cost > burst then
    return 2, nil, 0
  end
  if cost == 0 then
    return 0, nil, 0
  end
  local new_tat = st + cost * t
  local allow_at = new_tat - tau
  if allow_at > now then
    return 1, nil, allow_at - now
  end
  return 0, new_tat, 0
end

local function report(out, i, code, st, retry)
  local remaining, reset
  if algo(i) == 3 then
    local limit, w = param(i, 3), param(i, 2)
    local budget = math.floor(math.max(limit * w - st[3] * (w - sw_elapsed(i, st)), 0) / w)
    remaining = math.max(budget - st[2], 0)
    reset = sw_reset(i, st)
  elseif algo(i) == 2 then
    remaining = math.max(param(i, 3) - st[2], 0)
    reset = 0
    if st[2] > 0 then
      reset = fw_until_end(i, st[1])
    end
  else
    local t, tau, burst = param(i, 2), param(i, 3), param(i, 4)
    local room = now + tau - st
    remaining = 0
    if room > 0 then
      remaining = math.min(math.floor(room / t), burst)
    end
    reset = math.max(st - now, 0)
  end
  out[#out + 1] = code
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
end

local function peek_all()
  local out = {}
  for i = 1, n do
    local st = current(i)
    local code, _, retry = verdict(i, st)
    report(out, i, code, st, retry)
  end
  return out
end

if mode == 'refund' then
  for i = 1, n do
    local st = current(i)
    if algo(i) == 3 then
      st = {st[1], math.max(st[2] - cost_of(i), 0), st[3]}
    elseif algo(i) == 2 then
      st = {st[1], math.max(st[2] - cost_of(i), 0)}
    else
      st = math.max(load(i) - cost_of(i) * param(i, 2), 0)
    end
    cache[KEYS[i]] = st
    store(i, st)
  end
  return peek_all()
end

if mode == 'peek' then
  return peek_all()
end

local out = {}
local writes = {}
local denied = false
for i = 1, n do
  local st = current(i)
  local code, next_state, retry = verdict(i, st)
  if code ~= 0 then
    denied = true
    break
  end
  if next_state then
    cache[KEYS[i]] = next_state
    writes[i] = next_state
    report(out, i, code, next_state, retry)
  else
    report(out, i, code, st, retry)
  end
end

if denied then
  -- All-or-nothing: nothing was written; report every policy's state as it is.
  cache = {}
  return peek_all()
end
-- In charge order, so a key charged twice in one call ends with its last (cumulative) state.
for i = 1, n do
  if writes[i] then
    store(i, writes[i])
  end
end
return out
