-- Bans, the twin of the memory store's (MemoryStore::with_bans): a ban in force refuses the
-- whole call before anything is charged; after a denial that refuses the request, every
-- denied charge whose policy has a ban counts one refusal (each key once): the count starts
-- at the first refusal and runs `within`; the `after`-th refusal within it starts a ban of
-- `duration` (the count back at 0). Refusals during a ban count nothing.
--
-- A ban key holds "<until>:<first>:<count>" (µs), PX = until the ban ends and the count runs
-- out. Only calls whose policies have a ban send the bans' tail (see `protocol.rs`): the
-- others never read a ban key, and this chunk costs them one `next(ban_of)`.
--
-- ban_of[i] = {key, after, within, duration[, state]} for a charge i whose policy has one.
local ban_of = {}

-- Reads the bans' tail of `args`, whose charges end at `charges_end`: the per-ban values,
-- then their count b; the ban keys are the last b `keys`.
local function bans_start(keys, args, charges_end)
  ban_of = {}
  local b = tonumber(args[#args])
  for j = 1, b do
    local at = charges_end + BAN_ARGS * (j - 1)
    ban_of[tonumber(args[at + BAN_CHARGE])] = {key = keys[#keys - b + j],
      after = tonumber(args[at + BAN_REFUSALS]), within = tonumber(args[at + BAN_WITHIN]),
      duration = tonumber(args[at + BAN_DURATION])}
  end
end

local function ban_state(ban)
  if not ban.state then
    ban.state = {0, 0, 0}
    local raw = redis.call('GET', ban.key)
    if raw then
      local u, f, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
      if u then
        ban.state = {tonumber(u), tonumber(f), tonumber(c)}
      end
    end
  end
  return ban.state
end

-- µs until the ban of charge i ends, or nil (no ban in force).
local function ban_ends_in(i)
  local ban = ban_of[i]
  if not ban then
    return nil
  end
  local st = ban_state(ban)
  if st[1] > now then
    return st[1] - now
  end
  return nil
end

-- Counts one refusal of charge i; true when it starts a ban.
local function ban_refuse(i)
  local ban = ban_of[i]
  local st = ban_state(ban)
  if st[1] > now then
    return false
  end
  local first, count = st[2], st[3]
  if count == 0 or first + ban.within <= now then
    first, count = now, 0
  end
  count = count + 1
  local started = count >= ban.after
  local until_ = st[1]
  if started then
    until_, count = now + ban.duration, 0
  end
  ban.state = {until_, first, count}
  local live = math.max(until_ - now, 0)
  if count > 0 then
    live = math.max(live, first + ban.within - now)
  end
  redis.call('SET', ban.key, string.format('%d:%d:%d', until_, first, count), 'PX',
    px(live))
  return started
end

-- The row of charge i in `out` set to a ban's: code, 0 remaining, reset_after = retry_after
-- = `wait` µs (`less` ns off), no receipt, no hold.
local function ban_row(out, i, code, wait, less)
  local at = REPLY_HEAD + (i - 1) * ROW_LEN
  out[at + ROW_CODE] = code
  out[at + ROW_REMAINING] = 0
  out[at + ROW_RESET] = wait
  out[at + ROW_RETRY] = wait
  out[at + ROW_LESS] = less
  out[at + ROW_STAMP] = STAMP_NONE
  out[at + ROW_HOLD] = HOLD_UNBOUNDED
end

-- A ban in force for any charge refuses the call: nothing charged, every policy reports its
-- state, the ban ending last reports the ban; a reservation's (max_wait not nil) refusal is
-- final when the ban ends after max_wait. nil when no ban is in force.
local function ban_precheck(max_wait)
  if next(ban_of) == nil then
    return nil
  end
  local banned, longest = nil, 0
  for i = 1, n do
    local ends = ban_ends_in(i)
    if ends and ends > longest then
      banned, longest = i, ends
    end
  end
  if not banned then
    return nil
  end
  local out = peek_all()
  ban_row(out, banned, CODE_BANNED, longest, 0)
  if max_wait then
    out[#out + 1] = 0
    if longest > max_wait then
      out[#out + 1] = FINAL
    else
      out[#out + 1] = NOT_FINAL
    end
  end
  return out
end

-- After a denial answered in `out` (a check when max_wait is nil, else a reservation whose
-- last value says whether the denial is final): counts the refusals (see above) and marks a
-- refusal that starts a ban: retry_after = the longer of the ban and the quota's wait.
local function ban_count(out, max_wait)
  if next(ban_of) == nil then
    return out
  end
  local is_final = false
  if max_wait then
    is_final = out[#out] == FINAL
  end
  -- A reservation's denial refuses when it is final or its retry_after (µs, less 0..999
  -- ns: longer than max_wait exactly when the µs are) is longer than max_wait.
  local longest = 0
  for i = 1, n do
    local at = REPLY_HEAD + (i - 1) * ROW_LEN
    if out[at + ROW_CODE] == CODE_DENIED then
      longest = math.max(longest, out[at + ROW_RETRY])
    end
  end
  if max_wait and not is_final and longest <= max_wait then
    return out
  end
  local seen = {}
  for i = 1, n do
    local at = REPLY_HEAD + (i - 1) * ROW_LEN
    if ban_of[i] and out[at + ROW_CODE] == CODE_DENIED and not seen[K[i]] then
      seen[K[i]] = true
      if ban_refuse(i) then
        local wait, less = out[at + ROW_RETRY], out[at + ROW_LESS]
        if ban_of[i].duration >= wait then
          wait, less = ban_of[i].duration, 0
        end
        ban_row(out, i, CODE_BAN_STARTED, wait, less)
        if max_wait and wait > max_wait then
          out[#out] = FINAL
        end
      end
    end
  end
  return out
end
