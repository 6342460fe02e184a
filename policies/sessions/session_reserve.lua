-- A session's step riding on its request's budget reserve: one round trip, one atomic script
-- (policies/sessions/redis.py `step_reserving`; the reserve is reserve_fn.lua's).
-- KEYS: 1-7 the reserve's, 8 the session's HASH (in the team's hash slot, as the reserve's).
-- ARGV: the reserve's (its amount and tokens unused), then the step's (session_fn.lua), then
--   m, then m x (tier, amount nanos or '-', tokens): what the request reserves when the step
--   sends it to that tier ('-': nothing, no tier's context window holds it there).
-- Returns {the step's reply, the reserve's reply or {'none'}, amount nanos, tokens}.
local nperiods = tonumber(ARGV[6])
local first = 8 + 3 * nperiods + 2 * tonumber(ARGV[7 + 3 * nperiods])
-- A retry of a reserve whose answer was lost (or of a settled one) must not step twice.
local again = redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1
  or redis.call('HEXISTS', KEYS[7], ARGV[1]) == 1
local step, after = session_step(KEYS[8], first, not again)
local amount, tokens = '-', '0'
for i = 0, tonumber(ARGV[after]) - 1 do
  local o = after + 1 + 3 * i
  if ARGV[o] == step[1] then
    amount, tokens = ARGV[o + 1], ARGV[o + 2]
    break
  end
end
if amount == '-' then return {step, {'none'}, '0', '0'} end
return {step, reserve(amount, tokens), amount, tokens}
