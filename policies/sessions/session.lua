-- One request's step of a session (policies/sessions/store.py `choose` and `apply`, the same
-- rules): read the session's last tier, take the plan's move for it, write the update, renew
-- the expiry. One key per session (a hash tag: one slot on a Redis Cluster).
-- KEYS: 1 the session's HASH (l last tier, u tiers used "a,b", p prompt tokens, r requests,
--   s last seen).
-- ARGV: 1 ttl ms, 2 now (UNIX s), 3 prompt tokens, 4 fresh tier, 5 fresh reason, 6 fresh
--   record (1/0), 7 n, then n x (last tier, tier, reason, record).
-- Returns {tier, reason, record, previous last tier or '', tiers used, prompt tokens, requests}.
local key = KEYS[1]
local stored = redis.call('HMGET', key, 'l', 'u')
local last, used = stored[1], stored[2] or ''
local tier, reason, record = ARGV[4], ARGV[5], ARGV[6]
if last then
  local n = tonumber(ARGV[7])
  for i = 0, n - 1 do
    local b = 8 + 4 * i
    if ARGV[b] == last then
      tier, reason, record = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
      break
    end
  end
end
if record == '1' then
  redis.call('HSET', key, 'l', tier)
  if not string.find(',' .. used .. ',', ',' .. tier .. ',', 1, true) then
    if used == '' then used = tier else used = used .. ',' .. tier end
    redis.call('HSET', key, 'u', used)
  end
end
local p = redis.call('HINCRBY', key, 'p', tonumber(ARGV[3]))
local r = redis.call('HINCRBY', key, 'r', 1)
redis.call('HSET', key, 's', ARGV[2])
redis.call('PEXPIRE', key, tonumber(ARGV[1]))
return {tier, reason, record, last or '', used, p, r}
