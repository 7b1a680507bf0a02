-- ratekeeper GCRA, state format v1 (twin of ratekeeper_core::algorithm::Gcra, in integer µs).
--
-- KEYS[i]   one key per (policy, client key); all KEYS share one hash tag (one Cluster slot).
--           The value is the theoretical arrival time (TAT) in µs; absent = 0.
-- ARGV[1]   injected "now" in µs, or '' to read Redis TIME.
-- ARGV[2]   stale deadline in Unix µs (Redis TIME domain), or '': a call that reaches Redis
--           after it does nothing and returns {-1} (its caller already gave up on it).
-- ARGV[3]   'check' (all-or-nothing charge), 'peek' (no write) or 'refund'.
-- ARGV[4+4(i-1) .. 7+4(i-1)]  T (emission interval, µs), tau (= burst * T, µs), burst, cost.
--
-- Returns four integers per key: code (0 allowed, 1 denied, 2 cannot fit), remaining,
-- reset_after (µs) and retry_after (µs, 0 unless denied).
-- Every write sets PX to the time until the state equals "absent" (TAT - now, rounded up).
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
local n = #KEYS

local function param(i, j)
  return tonumber(ARGV[3 + (i - 1) * 4 + j])
end

local cache = {}
local function load(key)
  local v = cache[key]
  if v == nil then
    local raw = redis.call('GET', key)
    v = raw and tonumber(raw) or 0
    cache[key] = v
  end
  return v
end

local function store(key, tat)
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.0f', tat), 'PX',
      string.format('%.0f', math.ceil((tat - now) / 1000)))
  end
end

-- verdict for (tat = max(stored, now)): code, new_tat (nil = no change), retry_after
local function verdict(i, tat)
  local t, tau, burst, cost = param(i, 1), param(i, 2), param(i, 3), param(i, 4)
  if cost > burst then
    return 2, nil, 0
  end
  if cost == 0 then
    return 0, nil, 0
  end
  local new_tat = tat + cost * t
  local allow_at = new_tat - tau
  if allow_at > now then
    return 1, nil, allow_at - now
  end
  return 0, new_tat, 0
end

local function report(out, i, code, tat, retry)
  local t, tau, burst = param(i, 1), param(i, 2), param(i, 3)
  local room = now + tau - tat
  local remaining = 0
  if room > 0 then
    remaining = math.min(math.floor(room / t), burst)
  end
  local reset = tat - now
  if reset < 0 then
    reset = 0
  end
  out[#out + 1] = code
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
end

local function peek_all()
  local out = {}
  for i = 1, n do
    local tat = math.max(load(KEYS[i]), now)
    local code, _, retry = verdict(i, tat)
    report(out, i, code, tat, retry)
  end
  return out
end

if mode == 'refund' then
  for i = 1, n do
    local stored = load(KEYS[i])
    if stored > 0 then
      local back = stored - param(i, 4) * param(i, 1)
      if back < 0 then
        back = 0
      end
      cache[KEYS[i]] = back
      store(KEYS[i], back)
    end
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
  local tat = math.max(load(KEYS[i]), now)
  local code, new_tat, retry = verdict(i, tat)
  if code ~= 0 then
    denied = true
    break
  end
  if new_tat then
    cache[KEYS[i]] = new_tat
    writes[KEYS[i]] = new_tat
    report(out, i, code, new_tat, retry)
  else
    report(out, i, code, tat, retry)
  end
end

if denied then
  -- All-or-nothing: nothing was written; report every policy's state as it is.
  cache = {}
  return peek_all()
end
for key, tat in pairs(writes) do
  store(key, tat)
end
return out
