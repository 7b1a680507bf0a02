-- GCRA, the twin of ratekeeper_core::algorithm::Gcra (also the leaky-bucket meter: GCRA with
-- capacity = queue depth), in integer µs. Parameters: P1 = T, the emission interval; P2 =
-- tau = burst * T; P3 = burst. State "<TAT>:<T>:<tau>" ("<TAT>:<T>" from earlier deploys
-- reads as another tau); absent = TAT 0. In a call the state is the TAT, a number.
local gcra = {}

-- The stored TAT under the parameters in force: a TAT written under another emission
-- interval keeps its units in use, used = ceil((TAT - now) / T_old), re-spaced by the new T;
-- a TAT written under another tau (or by a deploy that did not record it) lies at most tau
-- ahead ("never fuller than full"). Under unchanged parameters the TAT is read as stored:
-- beyond now + tau it is turns that Delay-mode reservations already booked, which neither a
-- check, a reservation nor a lease may take (as the memory store reads its state).
function gcra.load(i, raw)
  if not raw then
    return 0
  end
  -- Written under the parameters in force (the common case): "<TAT>" and the suffix
  -- ":<T>:<tau>" as this call sent them; read as stored.
  local suffix = gcra.suffix(i)
  local at = string.find(raw, suffix, 1, true)
  if at and at + #suffix == #raw + 1 then
    local tat = tonumber(string.sub(raw, 1, at - 1))
    if tat then
      return tat
    end
  end
  local a, b, c = string.match(raw, '^(%d+):(%d+):?(%d*)$')
  if not a then
    return 0
  end
  local tat, t_old, tau_old = tonumber(a), tonumber(b), tonumber(c) or -1
  local t, tau = P1[i], P2[i]
  if tat > now and t_old ~= t then
    local used = math.ceil((tat - now) / t_old)
    tat = now + math.min(used * t, tau)
  end
  if tau_old ~= tau and tat > now + tau then
    tat = now + tau
  end
  return tat
end

-- ":<T>:<tau>" of charge i, as sent (made once per charge and call: a read and a write
-- both use it).
function gcra.suffix(i)
  local s = SUFFIX[i]
  if not s then
    local b = base[i]
    s = ':' .. argv[b + CHARGE_P1] .. ':' .. argv[b + CHARGE_P2]
    SUFFIX[i] = s
  end
  return s
end

-- The state of key i as stored, under the parameters in force.
function gcra.read(i)
  return gcra.load(i, redis.call('GET', K[i]))
end

-- The state at now: max(TAT, now).
function gcra.current(_, st)
  if st > now then
    return st
  end
  return now
end

-- Writes the TAT (PX until it, deleted when it is in the past: "absent").
function gcra.store(i, st)
  if st <= now then
    redis.call('DEL', K[i])
  else
    redis.call('SET', K[i], string.format('%d%s', st, gcra.suffix(i)), 'PX', px(st - now))
  end
end

function gcra.capacity(i)
  return P3[i]
end

-- code, new TAT (nil: no change), retry_after µs for a charge of COST[i] on TAT st.
function gcra.verdict(i, st)
  local cost = COST[i]
  if cost > P3[i] then
    return CODE_CANNOT_FIT, nil, 0
  end
  if cost == 0 then
    return CODE_ALLOWED, nil, 0
  end
  local new_tat = st + cost * P1[i]
  local allow_at = new_tat - P2[i]
  if allow_at > now then
    return CODE_DENIED, nil, allow_at - now
  end
  return CODE_ALLOWED, new_tat, 0
end

-- Whole cost-1 requests that pass at TAT st: floor((now + tau - TAT) / T), at most burst.
function gcra.remaining(i, st)
  local room = now + P2[i] - st
  if room <= 0 then
    return 0
  end
  -- floor(room / T) (exact: `%` floors), at most the burst.
  local t = P1[i]
  local whole = (room - room % t) / t
  if whole > P3[i] then
    return P3[i]
  end
  return whole
end

-- remaining, reset_after µs and hold (the fields follow from reset_after: unbounded).
function gcra.row(i, st)
  if st <= now then
    -- Full: the burst, and nothing to wait for.
    return P3[i], 0, HOLD_UNBOUNDED
  end
  return gcra.remaining(i, st), st - now, HOLD_UNBOUNDED
end

-- The receipt of a charge: the TAT right after it.
function gcra.receipt(_, st)
  return st
end

-- Gives back COST[i] units of the charge with receipt s (the TAT right after it; st the
-- stored TAT, read by `stored`, the call's cache):
--   st <= now          : the bucket drained the charge: nothing;
--   st == s            : the charge is the latest: TAT = s - cost * T;
--   st - tau > now     : a refund: a later reservation still waits for its slot, nothing;
--                        a correction's give-back (pays_debt): as the next rule;
--   otherwise          : min(cost * T, max(min(s, st) - now, 0)) off the top, so a charge
--                        never gives back time already drained, nor more than is
--                        outstanding.
--   Never below now (a TAT in the past is "absent": deleted).
function gcra.give_back(i, s, pays_debt, stored)
  local st = stored(i)
  if st <= now then
    return
  end
  if st ~= s and st - P2[i] > now and not pays_debt then
    return
  end
  local give = COST[i] * P1[i]
  if st ~= s then
    give = math.min(give, math.max(math.min(s, st) - now, 0))
  end
  if give > 0 then
    st = math.max(st - give, now)
    cache[K[i]] = st
    gcra.store(i, st)
  end
end

-- Charges COST[i] units at now without refusing (a correction's extra charge, the twin of
-- Gcra::debited): TAT = max(TAT, now) + cost * T.
function gcra.debit(i, st)
  return math.max(st, now) + COST[i] * P1[i]
end

-- The reset fence of key i (see limiter.lua, reset): max(stored TAT, now + tau), and how
-- long (µs) a stamp at or below it can still give back.
function gcra.fence(i)
  local tat = 0
  local raw = redis.call('GET', K[i])
  if raw then
    tat = tonumber(string.match(raw, '^(%d+)')) or 0
  end
  local fence = math.max(tat, now + P2[i])
  return fence, fence - now
end
