-- One request's step of a session (policies/sessions/store.py `choose` and `apply`, the same
-- rules), as a function: read the session's last tier, take the plan's move for it, write the
-- update, renew the expiry. session.lua runs it alone; session_reserve.lua runs it before the
-- request's budget reserve, in the same script.
-- key: the session's HASH (l last tier, u tiers used "a,b", p prompt tokens, r requests,
--   s last seen). ARGV from index b: ttl ms, now (UNIX s), prompt tokens, fresh tier, fresh
--   reason, fresh record (1/0), n, then n x (last tier, tier, reason, record).
-- write false: the move is only read (the request's reserve already ran once: a retry).
-- Returns {tier, reason, record, previous last tier or '', tiers used, prompt tokens,
--   requests}, and the index of the first ARGV after the step's.
local function session_step(key, b, write)
  local stored = redis.call('HMGET', key, 'l', 'u', 'p', 'r')
  local last, used = stored[1], stored[2] or ''
  local tier, reason, record = ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local n = tonumber(ARGV[b + 6])
  if last then
    for i = 0, n - 1 do
      local m = b + 7 + 4 * i
      if ARGV[m] == last then
        tier, reason, record = ARGV[m + 1], ARGV[m + 2], ARGV[m + 3]
        break
      end
    end
  end
  local after = b + 7 + 4 * n
  if not write then
    local p, r = tonumber(stored[3] or '0'), tonumber(stored[4] or '0')
    return {tier, reason, record, last or '', used, p, r}, after
  end
  if record == '1' then
    redis.call('HSET', key, 'l', tier)
    if not string.find(',' .. used .. ',', ',' .. tier .. ',', 1, true) then
      if used == '' then used = tier else used = used .. ',' .. tier end
      redis.call('HSET', key, 'u', used)
    end
  end
  local p = redis.call('HINCRBY', key, 'p', tonumber(ARGV[b + 2]))
  local r = redis.call('HINCRBY', key, 'r', 1)
  redis.call('HSET', key, 's', ARGV[b + 1])
  redis.call('PEXPIRE', key, tonumber(ARGV[b]))
  return {tier, reason, record, last or '', used, p, r}, after
end
