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
-- ALG, P1, P2, P3, COST, STAMP: per charge i, its algorithm id (the argument's text,
--            compared with the ALGO_* tokens), three parameters, cost and stamp (see
--            `protocol.rs`; GCRA: P1 = T µs, P2 = tau µs, P3 = burst; the windows and the log:
--            P1 = W µs, P2 = limit).
-- SUFFIX    per charge, a state's text after its first value, made when first needed
--            (false: not yet).
-- argv, base: the call's arguments as sent, and per charge i the position before its
--            own (its parameter k is argv[base[i] + k], k a CHARGE_* offset): a state's
--            parameters are written back as the text they came in, with no formatting.
-- cache      per key name, the state read (or written) during the call.
-- LEDGER     per key name, the FIFO ledger of a GCRA key read during the call, when its
--            state is one (see gcra.lua); `ledgers` says whether it holds any (so a call
--            on keys without a ledger never looks there).
local now, server_now, min_ttl = 0, 0, 0
local K = {}
local n = 0
local ALG, P1, P2, P3, COST, STAMP, SUFFIX = {}, {}, {}, {}, {}, {}, {}
local argv, base = {}, {}
local cache = {}
local LEDGER, ledgers = {}, false

-- The arguments are the store's own (decimal integers): read with `+ 0` (one conversion,
-- where `tonumber` makes two); a state read from a key, which could hold anything, is read
-- with `tonumber`.
--
-- Reads Redis TIME and starts a call on `keys`: false when the stale guard (Redis TIME µs,
-- '' for none) has passed: the caller already gave up on the call, which does nothing.
local function start(keys, args, now_arg, stale_arg, min_ttl_arg)
  local clock = redis.call('TIME')
  server_now = (clock[1] + 0) * 1000000 + clock[2]
  if stale_arg ~= '' and server_now > stale_arg + 0 then
    return false
  end
  now = server_now
  if now_arg ~= '' then
    now = now_arg + 0
  end
  if min_ttl_arg == '0' then
    min_ttl = 0
  else
    min_ttl = min_ttl_arg + 0
  end
  K, argv = keys, args
  cache = {}
  if ledgers then
    LEDGER, ledgers = {}, false
  end
  return true
end

-- PX (ms, as text) of a write whose state equals "absent" in `us` µs: rounded up to a ms,
-- at least min_ttl and at least 1.
--
-- Numbers are written with '%d' (an integer conversion: every state value is a whole
-- number below 2^53), never '%.0f' or as a number argument, whose floating-point
-- conversions cost more than the rest of a decision.
local function px(us)
  -- ceil(us / 1000) (exact: `%` floors), at least min_ttl and 1.
  local ms = (us + 999 - (us + 999) % 1000) / 1000
  if ms < min_ttl then
    ms = min_ttl
  end
  if ms < 1 then
    ms = 1
  end
  return string.format('%d', ms)
end

-- ':' and charge i's parameter k (a CHARGE_* offset) as sent.
local function text(i, k)
  return ':' .. argv[base[i] + k]
end
