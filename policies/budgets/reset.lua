-- Zero a scope's spend in the current daily, monthly and total windows; the ledger records it.
-- KEYS: 1 spend HASH, 2 ledger STREAM. ARGV: 1 scope, 2 team, 3 key id or '', 4..6 period ids.
-- Returns the nanos wiped.
local wiped = 0
for i = 4, 6 do
  local field = ARGV[1] .. '|' .. ARGV[i]
  wiped = wiped + tonumber(redis.call('HGET', KEYS[1], field) or '0')
  redis.call('HDEL', KEYS[1], field)
end
local text = string.format('%d', wiped)
redis.call('XADD', KEYS[2], '*', 'rid', '', 'team', ARGV[2], 'key', ARGV[3],
  'nanos', '-' .. text, 'tokens', '0', 'kind', 'reset',
  'periods', ARGV[1] .. '=' .. ARGV[4] .. ';' .. ARGV[1] .. '=' .. ARGV[5] .. ';' .. ARGV[1] .. '='
    .. ARGV[6])
return text
