-- Atomic check-and-reserve of a request's worst-case cost for every scope (team, key), as a
-- function: reserve.lua calls it with the amount the caller states; a script that chooses the
-- amount first (policies/sessions/session_reserve.lua) calls it with the one it chose.
-- KEYS: 1 spend HASH (scope|period -> nanos), 2 reserved HASH, 3 res HASH, 4 lease ZSET,
--       5 limits HASH (operator overrides: scope -> "nanos|period|rpm|tpm"),
--       6 rate HASH of the current minute (scope|r, scope|t), 7 done HASH of the current hour.
-- ARGV: 1 request id, 2 amount nanos, 3 tokens (read by the caller and passed as amount_s,
--       tokens_s), 4 lease ms, 5 seconds to the next minute,
--       6 number of periods P, then per period (periods.py PERIODS): name, window id, seconds to
--       its reset (-1: never), then the number of scopes, then per scope: scope name,
--       configured limit "nanos|period|rpm|tpm".
-- Returns {'ok', lease expiry ms, then per scope: name, period id, limit, spent, reserved before}
--      or {'exceeded', scope, reason, retry seconds} (for 'budget' then limit, spent, reserved,
--      period: what the refusal message reports) | {'held', record} | {'settled'}.
local function reserve(amount_s, tokens_s)
  local now = now_ms()
  reclaim(KEYS[2], KEYS[3], KEYS[4], now, 64)

  local rid = ARGV[1]
  local held = redis.call('HGET', KEYS[3], rid)
  if held then return {'held', held} end
  if redis.call('HEXISTS', KEYS[7], rid) == 1 then return {'settled'} end

  local amount = tonumber(amount_s)
  local tokens = tonumber(tokens_s)
  local windows = {}
  local nperiods = tonumber(ARGV[6])
  for i = 0, nperiods - 1 do
    windows[ARGV[7 + 3 * i]] = {ARGV[8 + 3 * i], ARGV[9 + 3 * i]}
  end
  local base = 7 + 3 * nperiods -- the number of scopes; their pairs follow
  local plan = {}
  for i = 0, tonumber(ARGV[base]) - 1 do
    local scope = ARGV[base + 1 + 2 * i]
    local enc = redis.call('HGET', KEYS[5], scope) or ARGV[base + 2 + 2 * i]
    local lim, period, rpm, tpm = string.match(enc, '^(-?%d+)|(%a+)|(-?%d+)|(-?%d+)$')
    local win = windows[period]
    if tonumber(rpm) >= 0 then
      local used = tonumber(redis.call('HGET', KEYS[6], scope .. '|r') or '0')
      if used + 1 > tonumber(rpm) then return {'exceeded', scope, 'rpm', ARGV[5]} end
    end
    if tonumber(tpm) >= 0 then
      local used = tonumber(redis.call('HGET', KEYS[6], scope .. '|t') or '0')
      if used + tokens > tonumber(tpm) then return {'exceeded', scope, 'tpm', ARGV[5]} end
    end
    local spent = redis.call('HGET', KEYS[1], scope .. '|' .. win[1]) or '0'
    local reserved = redis.call('HGET', KEYS[2], scope) or '0'
    if tonumber(lim) >= 0 and tonumber(spent) + tonumber(reserved) + amount > tonumber(lim) then
      return {'exceeded', scope, 'budget', win[2], lim, spent, reserved, period}
    end
    plan[#plan + 1] = {scope, win[1], lim, spent, reserved}
  end

  local periods = {}
  local out = {'ok', string.format('%d', now + tonumber(ARGV[4]))}
  for _, e in ipairs(plan) do
    redis.call('HINCRBY', KEYS[2], e[1], amount_s)
    redis.call('HINCRBY', KEYS[6], e[1] .. '|r', 1)
    redis.call('HINCRBY', KEYS[6], e[1] .. '|t', tokens_s)
    periods[e[1]] = e[2]
    for _, v in ipairs(e) do out[#out + 1] = v end
  end
  redis.call('EXPIRE', KEYS[6], 120)
  local record = {a = amount_s, t = tokens_s, p = periods, m = KEYS[6]}
  redis.call('HSET', KEYS[3], rid, cjson.encode(record))
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[4]), rid)
  return out
end
