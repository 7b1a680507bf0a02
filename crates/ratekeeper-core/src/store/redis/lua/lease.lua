-- The lease, for the tiered store (`store::tiered`): charges a batch of units on one
-- (policy, client key) state atomically (same keys, same state format and same algorithm
-- chunks as the limiter) and returns how many were granted, which the caller spends locally.
--
-- KEYS      the state key; the key's lease record, "<state>#leased": "<units>:<back_by>"
--           (µs), the units granted ahead of a request (taken to be spent later) by leases
--           that may still hold them, and when the last of those leases gives its unspent
--           units back at the latest. An upper bound: units spent or given back meanwhile
--           are not taken off it. Read as absent once back_by has passed; PX until back_by.
-- ARGV      see `protocol.rs` (LEASE_ARG_*): injected now or '', the stale guard or '', the
--           least PX (ms), the algorithm (GCRA or fixed window) and its three parameters,
--           need (the least grant worth having: the request's cost; 0 for a background
--           renewal; fewer available is a denial and writes nothing), want (the most to
--           grant, at least need) and back_within (how long after this call a lease's unspent
--           units are back in Redis at the latest, µs).
--
-- Grant: with `room` units free now and `reserve` = ceil(capacity / 2) (GCRA: the burst;
-- fixed window: the limit), grant = min(want, max(need, room - reserve)) when room >= need.
-- Units beyond `need` (taken ahead, to be spent later) only ever come from the upper half of
-- the bucket or window: in the lower half a lease takes exactly the request's cost, so near
-- the limit no unit the client is still owed sits unspent on one instance while the client
-- talks to another. (This also caps a grant at half of what is left: room - reserve <=
-- ceil(room / 2) for room <= capacity.) A grant of nothing writes nothing: the state stays
-- as it is, a fixed window's count above the limit (a correction's debt) included.
--
-- Reply {server_now, status, granted, code, remaining, reset_after, retry_after, stamp,
-- out_units, out_for}: STATUS_STALE alone (nothing written) or STATUS_DONE; code
-- CODE_ALLOWED (granted >= need), CODE_DENIED or CODE_CANNOT_FIT (need > capacity);
-- remaining after the grant; reset_after and retry_after in µs (retry_after the state's
-- alone: the caller bounds it by the record); stamp the receipt of the whole grant
-- (STAMP_NONE: nothing granted); out_units and out_for the lease record after the call
-- (units that may come back, and in how many µs at the latest; 0 0 without one). A refund
-- of unused units is the limiter's refund with this stamp.
local function lease(keys, args)
  if not start(keys, args, args[LEASE_ARG_NOW], args[LEASE_ARG_STALE], args[LEASE_ARG_MIN_TTL])
  then
    return {server_now, STATUS_STALE}
  end
  -- One charge, its arguments laid out as a limiter charge's (`base`, see the prelude).
  n = 1
  base[1] = LEASE_ARG_ALGO - CHARGE_ALGO
  SUFFIX[1] = false
  ALG[1] = args[LEASE_ARG_ALGO]
  P1[1] = args[LEASE_ARG_P1] + 0
  P2[1] = args[LEASE_ARG_P2] + 0
  P3[1] = args[LEASE_ARG_P3] + 0
  local need, want = args[LEASE_ARG_NEED] + 0, args[LEASE_ARG_WANT] + 0
  local back_within = args[LEASE_ARG_BACK_WITHIN] + 0
  local algo = algorithm(1)
  if algo ~= gcra and algo ~= fixed_window then
    return redis.error_reply('ratekeeper: a lease takes GCRA or a fixed window')
  end
  local st = algo.current(1, algo.read(1))

  -- The lease record: units granted ahead that may still come back, until back_by.
  local record_key = keys[LEASE_KEY_RECORD]
  local out_units, out_by = 0, 0
  local rec = redis.call('GET', record_key)
  if rec then
    local u, b = string.match(rec, '^(%d+):(%d+)$')
    if u and tonumber(b) > now then
      out_units, out_by = tonumber(u), tonumber(b)
    end
  end
  local function reply(granted, code, remaining, reset, retry, stamp)
    local out_for = 0
    if out_units > 0 then
      out_for = out_by - now
    end
    return {server_now, STATUS_DONE, granted, code, remaining, reset, retry, stamp, out_units,
      out_for}
  end

  -- room: units free now; capacity; the state after `grant` more units; when units granted
  -- ahead are back at the latest (a fixed window's end: units given back after it no longer
  -- count, so a record never outlives the window its units were charged in).
  local room, capacity, last
  if algo == fixed_window then
    room, capacity, last = math.max(P2[1] - st[2], 0), P2[1], (st[1] + 1) * P1[1]
  else
    room, capacity, last = math.floor((now + P2[1] - st) / P1[1]), P3[1], now + back_within
  end
  local remaining, reset = algo.row(1, st)
  if need > capacity then
    return reply(0, CODE_CANNOT_FIT, remaining, reset, 0, STAMP_NONE)
  end
  if room < need then
    -- Until `need` units fit: the window's end, or GCRA's TAT + need * T - tau (turns
    -- booked beyond now + tau included).
    local retry
    if algo == fixed_window then
      retry = algo.until_end(1, st[1])
    else
      retry = st + need * P1[1] - P2[1] - now
    end
    return reply(0, CODE_DENIED, remaining, reset, retry, STAMP_NONE)
  end
  local grant = math.min(want, math.max(need, room - math.ceil(capacity / 2)))
  local after = st
  if grant > 0 then
    COST[1] = grant
    local _, next_state = algo.verdict(1, st)
    after = next_state
    store(1, after)
  end
  local ahead = grant - need
  if ahead > 0 then
    out_units = out_units + ahead
    out_by = math.max(out_by, math.min(now + back_within, last))
    redis.call('SET', record_key, string.format('%d:%d', out_units, out_by), 'PX',
      px(out_by - now))
  end
  remaining, reset = algo.row(1, after)
  if algo == fixed_window then
    -- The window's end, granted or not (a renewal that took nothing included).
    reset = algo.until_end(1, after[1])
  end
  return reply(grant, CODE_ALLOWED, remaining, reset, 0, algo.receipt(1, after))
end
