-- GCRA, the twin of ratekeeper_core::algorithm::Gcra (also the leaky-bucket meter: GCRA with
-- capacity = queue depth), in integer µs. Parameters: P1 = T, the emission interval; P2 =
-- tau = burst * T; P3 = burst. State "<TAT>:<T>:<tau>" ("<TAT>:<T>" from earlier deploys
-- reads as another tau); absent = TAT 0. In a call the state is the TAT, a number.
--
-- A key that had a charge refunded out of the middle of its schedule (an earlier charge,
-- still partly undrained) keeps its schedule as a FIFO ledger instead, the twin of the
-- memory store's: state "L:<T>:<tau>:<at>:<next>:<from>:<to>...", the spans (from, to]
-- the live parts of the schedule, oldest first, in the coordinates of the stamps (holes
-- between them are slots refunded out of the middle), drained from the front up to `at`;
-- `next` where the next slot starts (at or above every stamp handed out). In a call its
-- state is its TAT, max(at, now) + the live length, decided on as any TAT, and
-- LEDGER[key] the ledger: a charge appends its slot, a refund takes its own slot's live
-- part out. The key lives until the ledger is empty and every stamp it handed out is
-- stale (`next` passed); then its next charge starts a TAT again.
local gcra = {}

-- Drains ledger lg up to now: the time passed comes off the front of its spans.
local function ledger_drain(lg)
  local left = now - lg.at
  if left <= 0 then
    return
  end
  lg.at = now
  local s, keep = lg.spans, {}
  for j = 1, #s, 2 do
    local a, b = s[j], s[j + 1]
    if left >= b - a then
      left = left - (b - a)
    else
      keep[#keep + 1] = a + left
      keep[#keep + 1] = b
      left = 0
    end
  end
  lg.spans = keep
end

-- The ledger state `raw` of key i, drained to now (LEDGER[K[i]]); returns its TAT.
local function ledger_load(i, raw)
  local v = {}
  for d in string.gmatch(raw, '%d+') do
    v[#v + 1] = tonumber(d)
  end
  local lg = {at = v[3] or now, next = v[4] or 0, spans = {}, extra = 0}
  for j = 5, #v - 1, 2 do
    lg.spans[#lg.spans + 1] = v[j]
    lg.spans[#lg.spans + 1] = v[j + 1]
  end
  ledger_drain(lg)
  local live = 0
  for j = 1, #lg.spans, 2 do
    live = live + lg.spans[j + 1] - lg.spans[j]
  end
  lg.tat = math.max(lg.at, now) + live
  LEDGER[K[i]], ledgers = lg, true
  return lg.tat
end

-- Past LEDGER_MAX_SPANS spans, fills the smallest hole between two spans again (the key
-- may then wait longer than its exact schedule says, never less). The time filled is in
-- lg.extra: the call's TAT (lg.tat, as cached) sees it from the next call on.
local function ledger_bound(lg)
  local s = lg.spans
  while #s > 2 * LEDGER_MAX_SPANS do
    local best, gap = 1, s[3] - s[2]
    for j = 3, #s - 3, 2 do
      local g = s[j + 2] - s[j + 1]
      if g < gap then
        best, gap = j, g
      end
    end
    lg.extra = lg.extra + gap
    s[best + 1] = s[best + 3]
    table.remove(s, best + 2)
    table.remove(s, best + 2)
  end
end

-- Where ledger lg's next slot starts: `next`, or now when the schedule is empty and
-- `next` passed.
local function ledger_from(lg)
  if #lg.spans == 0 and now > lg.next then
    return now
  end
  return lg.next
end

-- Appends a slot of `len` to ledger lg.
local function ledger_push(lg, len)
  local s = lg.spans
  local from = ledger_from(lg)
  local to = from + len
  if #s > 0 and s[#s] == from then
    s[#s] = to
  else
    s[#s + 1] = from
    s[#s + 1] = to
    ledger_bound(lg)
  end
  lg.next = to
  lg.tat = lg.tat + len
end

-- Takes up to `len` of ledger lg's live time at or below `stamp`, from the top down (the
-- twin of Ledger::give_back); returns the length taken.
local function ledger_take(lg, stamp, len)
  local s, left = lg.spans, len
  local j = #s - 1
  while j >= 1 and left > 0 do
    local a, b = s[j], s[j + 1]
    if a < stamp then
      local hi = math.min(b, stamp)
      local lo = math.max(hi - left, a)
      left = left - (hi - lo)
      if a < lo and hi < b then
        s[j + 1] = lo
        table.insert(s, j + 2, hi)
        table.insert(s, j + 3, b)
      elseif a < lo then
        s[j + 1] = lo
      elseif hi < b then
        s[j] = hi
      else
        table.remove(s, j)
        table.remove(s, j)
      end
    end
    j = j - 2
  end
  local taken = len - left
  if taken > 0 then
    lg.tat = lg.tat - taken
    ledger_bound(lg)
  end
  return taken
end

-- Writes ledger lg as key i's state, PX until it is empty and `next` passed (then deleted).
local function ledger_store(i, lg)
  local last = math.max(lg.tat + lg.extra, lg.next)
  if last <= now then
    redis.call('DEL', K[i])
    return
  end
  local parts = {'L', gcra.suffix(i), string.format(':%d:%d', lg.at, lg.next)}
  for j = 1, #lg.spans do
    parts[#parts + 1] = string.format(':%d', lg.spans[j])
  end
  redis.call('SET', K[i], table.concat(parts), 'PX', px(last - now))
end

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
  if string.byte(raw) == 76 then
    -- 'L': a ledger (its text never reads as a TAT above: it starts with a letter).
    return ledger_load(i, raw)
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

-- Writes the TAT (PX until it, deleted when it is in the past: "absent"); on a ledger,
-- appends the slot of what was charged.
function gcra.store(i, st)
  local lg = ledgers and LEDGER[K[i]]
  if lg then
    if st > lg.tat then
      ledger_push(lg, st - lg.tat)
    end
    ledger_store(i, lg)
    return
  end
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

-- The receipt of a charge: the TAT right after it; on a ledger, the end of the slot it
-- takes (or took: the state may be written already).
function gcra.receipt(i, st)
  local lg = ledgers and LEDGER[K[i]]
  if lg then
    if st <= lg.tat then
      return lg.next - (lg.tat - st)
    end
    return ledger_from(lg) + (st - lg.tat)
  end
  return st
end

-- Gives back COST[i] units of the charge with receipt s (the TAT right after it; st the
-- stored TAT, read by `stored`, the call's cache):
--   st <= now          : the bucket drained the charge: nothing;
--   st == s            : the charge is the latest: TAT = s - cost * T;
--   st - tau > now     : a refund: a later reservation still waits for its slot, nothing;
--                        a correction's give-back (pays_debt): as the next rule;
--   otherwise          : out of the middle of the schedule: the key's schedule becomes a
--                        ledger (live from now to st), where the rule below applies.
-- On a ledger: up to cost * T of the live time at or below s comes out, from the top down
-- (the charge's own live part: the drain cuts a slot from its front, its own give-backs
-- from its top), and the slots after it move up; a refund gives back nothing while a
-- later slot reaches beyond now + tau (a reservation waits for its turn). Never anything
-- drained, nor another charge's time.
function gcra.give_back(i, s, pays_debt, stored)
  local st = stored(i)
  local lg = ledgers and LEDGER[K[i]]
  local give = COST[i] * P1[i]
  if not lg then
    if st <= now then
      return
    end
    if st ~= s and st - P2[i] > now and not pays_debt then
      return
    end
    if st == s then
      cache[K[i]] = math.max(st - give, now)
      gcra.store(i, cache[K[i]])
      return
    end
    if math.min(s, st) - now <= 0 then
      return
    end
    lg = {at = now, next = st, spans = {now, st}, tat = st, extra = 0}
    LEDGER[K[i]], ledgers = lg, true
  elseif not pays_debt then
    local sp = lg.spans
    if #sp > 0 and sp[#sp] > s and lg.tat + lg.extra - now > P2[i] then
      return
    end
  end
  if ledger_take(lg, s, give) > 0 then
    cache[K[i]] = lg.tat
    ledger_store(i, lg)
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
  if raw and string.byte(raw) == 76 then
    -- A ledger: its TAT, or its stamps' bound if higher.
    tat = ledger_load(i, raw)
    tat = math.max(tat, LEDGER[K[i]].next)
  elseif raw then
    tat = tonumber(string.match(raw, '^(%d+)')) or 0
  end
  local fence = math.max(tat, now + P2[i])
  return fence, fence - now
end
