-- Reservations for the Delay mode (all-or-nothing like a check), per charge by how its
-- policy reserves (the charge's stamp in a reservation, see `protocol.rs`):
--   RESERVE_GCRA (the twin of Gcra::reserve): tat = max(stored, now) read as stored (turns
--     already booked included); new_tat = tat + n * T; wait = max(new_tat - tau - now, 0);
--     reserved when wait <= max_wait (TAT := new_tat, delay = wait), else denied with
--     retry_after = wait - max_wait, final.
--   RESERVE_SHAPER, the leaky-bucket shaper (the twin of LeakyBucket::shape): tat = the
--     state in force; delay = tat - now; queued when the meter allows and delay <=
--     max_wait, else denied with retry_after = max(the meter's retry_after, delay -
--     max_wait), final.
--   RESERVE_NONE: a check; its denials are not final (check-and-retry).
-- Each returns code, the state to write (nil: none), retry_after µs, the delay µs, the state
-- to report, and the ns off retry_after.

-- The state the leaky-bucket shaper reads (LeakyBucket::shape), and whether it is a debt:
-- the state in force, at most tau ahead; the shaper never queues beyond tau, so a TAT
-- beyond now + tau is a correction's debt, which a charge that can fit (0 < cost <= burst)
-- reads as stored, and waits out (as the memory store's shaper).
local function shaper_state(i, cost)
  local st, horizon = current(i), now + P2[i]
  if st <= horizon then
    return st, false
  end
  if cost > 0 and cost <= P3[i] then
    return st, true
  end
  return horizon, false
end

local function reserve_gcra(i, cost, max_wait)
  local tat = math.max(load(i), now)
  if cost > P3[i] then
    return CODE_CANNOT_FIT, nil, 0, 0, tat
  elseif cost > 0 then
    local new_tat = tat + cost * P1[i]
    local w = math.max(new_tat - P2[i] - now, 0)
    if w <= max_wait then
      return CODE_ALLOWED, new_tat, 0, w, new_tat
    end
    return CODE_DENIED, nil, w - max_wait, 0, tat
  end
  return CODE_ALLOWED, nil, 0, 0, tat
end

local function reserve_shaper(i, cost, max_wait)
  local st, in_debt = shaper_state(i, cost)
  if in_debt then
    -- Waits the debt out: until the charge fits the bucket and the queue max_wait.
    return CODE_DENIED, nil,
      math.max(st + cost * P1[i] - P2[i] - now, st - now - max_wait), 0, st
  elseif cost > 0 then
    local d = st - now
    local c, ns, r = verdict(i, st)
    if c == CODE_ALLOWED and d <= max_wait then
      return CODE_ALLOWED, ns, 0, d, ns
    elseif c == CODE_CANNOT_FIT then
      return CODE_CANNOT_FIT, nil, 0, 0, st
    end
    return CODE_DENIED, nil, math.max(r, d - math.min(max_wait, d)), 0, st
  end
  return CODE_ALLOWED, nil, 0, 0, st
end

-- The state a refused reservation reports for charge i of kind `kind` (nothing written).
local function reserve_shown(i, kind, cost)
  if kind == RESERVE_GCRA then
    return math.max(load(i), now)
  elseif kind == RESERVE_SHAPER then
    return (shaper_state(i, cost))
  end
  return current(i)
end
