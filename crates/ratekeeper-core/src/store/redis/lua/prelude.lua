-- prelude: the state every chunk reads during one call, set by `start`. The functions of
-- the library are defined once (Redis FUNCTION LOAD: when the library loads; EVAL: once
-- per call) and read the call's values from these locals, which `start` sets first: Redis
-- runs one call at a time, so a call never sees another's values.
--
-- now        the decision time, µs: Redis TIME, or the injected time.
-- server_now Redis TIME, µs (always: the caller's stale guard learns from it).
-- min_ttl    least PX of a write, ms (0: none).
-- K          the call's KEYS (the states first).
-- n          the number of charges.
-- ALG, P1, P2, P3, COST, STAMP: per charge i, its algorithm id, three parameters, cost
--            and stamp (see `protocol.rs`; GCRA: P1 = T µs, P2 = tau µs, P3 = burst; the
--            windows and the log: P1 = W µs, P2 = limit).
-- cache      per key name, the state read (or written) during the call.
-- spent      per key name, the units the call's charges so far asked of it.
local now, server_now, min_ttl = 0, 0, 0
local K = {}
local n = 0
local ALG, P1, P2, P3, COST, STAMP = {}, {}, {}, {}, {}, {}
local cache, spent = {}, {}

-- Reads Redis TIME and starts a call on `keys`: false when the stale guard (Redis TIME µs,
-- '' for none) has passed: the caller already gave up on the call, which does nothing.
local function start(keys, now_arg, stale_arg, min_ttl_arg)
  local clock = redis.call('TIME')
  server_now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  if stale_arg ~= '' and server_now > tonumber(stale_arg) then
    return false
  end
  now = server_now
  if now_arg ~= '' then
    now = tonumber(now_arg)
  end
  min_ttl = tonumber(min_ttl_arg) or 0
  K = keys
  cache, spent = {}, {}
  return true
end

-- PX (ms, as text) of a write whose state equals "absent" in `us` µs: rounded up to a ms, at
-- least min_ttl and at least 1.
local function px(us)
  return string.format('%.0f', math.max(1, min_ttl, math.ceil(us / 1000)))
end
